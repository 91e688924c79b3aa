package mcpproxy

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkit/idem"
)

// The test binary is re-executed in one of these roles (IDEM_MCPPROXY_ROLE):
// "proxy" runs Proxy.Serve on stdin and stdout; "orders" is a tiny MCP server
// of the Go SDK with a counted side effect; "exit" is a server that dies at
// once.
const roleEnv = "IDEM_MCPPROXY_ROLE"

func TestMain(m *testing.M) {
	switch os.Getenv(roleEnv) {
	case "proxy":
		os.Exit(proxyMain())
	case "orders":
		os.Exit(ordersMain())
	case "exit":
		os.Exit(3)
	}
	os.Exit(m.Run())
}

// proxyMain is the proxy: IDEM_TEST_DB is its file, IDEM_TEST_CONFIG the
// configuration's text, IDEM_TEST_COMMAND the server's argv as a JSON array;
// IDEM_TEST_INFLIGHT=fail and IDEM_TEST_RECOVERY=refuse set the engine's
// policies, IDEM_TEST_MAXRESPONSE its MaxResponseSize, IDEM_TEST_MAXSIZE the
// file's MaxSize, IDEM_TEST_MAXWAIT the
// proxy's MaxWait.
func proxyMain() int {
	signal.Ignore(syscall.SIGPIPE) // as the idem command does
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	cfg, err := ParseConfig([]byte(os.Getenv("IDEM_TEST_CONFIG")))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var argv []string
	if err := json.Unmarshal([]byte(os.Getenv("IDEM_TEST_COMMAND")), &argv); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	file, opts := &idem.BoltOptions{NoSync: true}, &idem.Options{}
	if os.Getenv("IDEM_TEST_INFLIGHT") == "fail" {
		opts.InFlight = idem.InFlightFail
	}
	if os.Getenv("IDEM_TEST_RECOVERY") == "refuse" {
		opts.Recovery = idem.RecoverRefuse
	}
	if n, err := strconv.Atoi(os.Getenv("IDEM_TEST_MAXRESPONSE")); err == nil {
		opts.MaxResponseSize = n
	}
	if n, err := strconv.Atoi(os.Getenv("IDEM_TEST_MAXSIZE")); err == nil {
		file.MaxSize = n
	}
	e, err := idem.OpenFile(os.Getenv("IDEM_TEST_DB"), file, opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer e.Close()
	p := &Proxy{Engine: e, Config: cfg, Command: argv}
	if d := os.Getenv("IDEM_TEST_MAXWAIT"); d != "" {
		if p.MaxWait, err = time.ParseDuration(d); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	if err := p.Serve(ctx, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "proxy:", err)
		return 1
	}
	return 0
}

// The orders server's files, under the directory IDEM_TEST_LEDGER names:
// effects.jsonl gets one line per order created (the counted side effect),
// calls.jsonl one line per execution of a tool, blocked the pid of a server
// blocked mid-call, gate (made by the test) releases gated_order.
type execution struct {
	Tool      string `json:"tool"`
	Key       string `json:"key"`
	Recovered bool   `json:"recovered"`
	Attempt   int    `json:"attempt"`
	PID       int    `json:"pid"`
	Cancelled bool   `json:"cancelled"`
	Finished  bool   `json:"finished"`
}

type effect struct {
	Key string `json:"key"`
	SKU string `json:"sku"`
	Qty int    `json:"qty"`
}

type orderIn struct {
	SKU string `json:"sku"`
	Qty int    `json:"qty"`
}

func appendJSON(path string, v any) {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		panic(err)
	}
	b, _ := json.Marshal(v)
	if _, err := f.Write(append(b, '\n')); err != nil {
		panic(err)
	}
	if err := f.Sync(); err != nil {
		panic(err)
	}
	f.Close()
}

// readJSONL reads the lines of path into values of T; a missing file is empty.
func readJSONL[T any](path string) []T {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		panic(err)
	}
	defer f.Close()
	var out []T
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var v T
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			panic(err)
		}
		out = append(out, v)
	}
	return out
}

func text(s string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
}

// ordersMain is a tool server with a counted side effect. Its tools:
// create_order makes an order; slow_order makes it, then blocks on its first
// attempt until killed; gated_order makes it, then waits for the gate file;
// naive_slow_order is slow_order without reconciliation; stuck_order blocks
// on every attempt; declined answers a
// JSON-RPC error (a raw handler); flaky answers MetaRetryable on its first
// call; gated_flaky too, once the gate-flaky file exists; get_order is
// read-only. A key-aware tool reconciles a recovered call:
// if its key already made an order, it answers that order.
func ordersMain() int {
	dir := os.Getenv("IDEM_TEST_LEDGER")
	effects, calls := filepath.Join(dir, "effects.jsonl"), filepath.Join(dir, "calls.jsonl")
	opts := &mcp.ServerOptions{}
	if n, err := strconv.Atoi(os.Getenv("IDEM_TEST_PAGESIZE")); err == nil {
		opts.PageSize = n // tools/list in pages of n
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "orders", Version: "1"}, opts)
	order := func(name string, reconcile bool, wait func(context.Context) error, always bool) {
		mcp.AddTool(s, &mcp.Tool{Name: name}, func(ctx context.Context, req *mcp.CallToolRequest, in orderIn) (*mcp.CallToolResult, any, error) {
			meta := req.Params.Meta
			key, _ := meta[MetaKey].(string)
			recovered, _ := meta[MetaRecovered].(bool)
			attempt, _ := meta[MetaAttempt].(float64)
			ex := execution{Tool: name, Key: key, Recovered: recovered, Attempt: int(attempt), PID: os.Getpid()}
			appendJSON(calls, ex)
			if reconcile && recovered {
				for i, e := range readJSONL[effect](effects) {
					if e.Key == key {
						return text(fmt.Sprintf("order %d: %d x %s", i+1, e.Qty, e.SKU)), nil, nil
					}
				}
			}
			appendJSON(effects, effect{Key: key, SKU: in.SKU, Qty: in.Qty})
			n := len(readJSONL[effect](effects))
			if wait != nil && (!recovered || always) {
				if err := os.WriteFile(filepath.Join(dir, "blocked"), fmt.Appendf(nil, "%d", os.Getpid()), 0o600); err != nil {
					panic(err)
				}
				if err := wait(ctx); err != nil {
					return nil, nil, err
				}
				if tok := req.Params.GetProgressToken(); tok != nil {
					// A message to the client between the effect and the
					// answer.
					_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: 1, Total: 1})
				}
				ex.Finished, ex.Cancelled = true, ctx.Err() != nil
				appendJSON(calls, ex)
			}
			return text(fmt.Sprintf("order %d: %d x %s", n, in.Qty, in.SKU)), nil, nil
		})
	}
	forever := func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
	gate := func(context.Context) error {
		for {
			// Deliberately deaf to ctx: the test checks that no
			// cancellation reached the server.
			if _, err := os.Stat(filepath.Join(dir, "gate")); err == nil {
				return nil
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	order("create_order", true, nil, false)
	order("slow_order", true, forever, false)
	order("naive_slow_order", false, forever, false)
	order("stuck_order", false, forever, true)
	order("gated_order", true, gate, false)
	s.AddTool(&mcp.Tool{Name: "declined", InputSchema: map[string]any{"type": "object"}},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			appendJSON(calls, execution{Tool: "declined", PID: os.Getpid()})
			return nil, &jsonrpc.Error{Code: -32001, Message: "card declined"}
		})
	mcp.AddTool(s, &mcp.Tool{Name: "flaky"}, func(ctx context.Context, req *mcp.CallToolRequest, in orderIn) (*mcp.CallToolResult, any, error) {
		n := earlier(calls, "flaky")
		if n == 0 {
			r := text("try again")
			r.Meta = mcp.Meta{MetaRetryable: true}
			return r, nil, nil
		}
		return text(fmt.Sprintf("flaky ok after %d", n)), nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "gated_flaky"}, func(ctx context.Context, req *mcp.CallToolRequest, in orderIn) (*mcp.CallToolResult, any, error) {
		n := earlier(calls, "gated_flaky")
		if n > 0 {
			return text(fmt.Sprintf("gated_flaky ok after %d", n)), nil, nil
		}
		if err := os.WriteFile(filepath.Join(dir, "blocked-flaky"), []byte("1"), 0o600); err != nil {
			panic(err)
		}
		for _, err := os.Stat(filepath.Join(dir, "gate-flaky")); err != nil; _, err = os.Stat(filepath.Join(dir, "gate-flaky")) {
			time.Sleep(5 * time.Millisecond)
		}
		r := text("try again")
		r.Meta = mcp.Meta{MetaRetryable: true}
		return r, nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "get_order", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
			return text(fmt.Sprintf("%d orders", len(readJSONL[effect](effects)))), nil, nil
		})
	if err := s.Run(context.Background(), &mcp.StdioTransport{}); err != nil && !strings.Contains(err.Error(), "EOF") {
		fmt.Fprintln(os.Stderr, "orders:", err)
		return 1
	}
	return 0
}

// earlier counts the executions of tool in the calls file, then records
// one more.
func earlier(calls, tool string) int {
	n := 0
	for _, c := range readJSONL[execution](calls) {
		if c.Tool == tool {
			n++
		}
	}
	appendJSON(calls, execution{Tool: tool, PID: os.Getpid()})
	return n
}
