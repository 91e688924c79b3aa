package taubench

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.etcd.io/bbolt"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemmcp"
)

// EffectsBucket counts, per idempotency key (as sent in _meta), the write
// executions that changed the retail database, in the same transaction as
// the change: what a killed server committed is counted, nothing else.
const EffectsBucket = "tau_mcp_effects"

// RecoveredBucket holds, per idempotency key, a mark (one byte, 1) that a
// write call with the key was executed with _meta idemmcp.MetaRecovered true:
// idem mcp-proxy re-executing a call whose server was killed. It is set in
// the transaction of the call, whether or not the call changed anything.
const RecoveredBucket = "tau_mcp_recovered"

// The crash points of a served tool call: inside the write call after the
// tool ran but before its transaction committed, or after the commit before
// the answer is sent.
const (
	// MCPBeforeCommit: the tool ran, its transaction has not committed.
	MCPBeforeCommit = "before-commit"
	// MCPAfterCommit: the transaction committed, the answer is not sent.
	MCPAfterCommit = "after-commit"
)

// ServeConfig is one MCP server of the 16 retail tools over a seeded file.
type ServeConfig struct {
	// DB is the bbolt file (seeded with Seed).
	DB string `json:"db"`
	// Idem serves the tools through idemmcp: write tools in the DoTx form
	// under the key from _meta, read tools (annotated read-only) passed
	// through. False serves them with no dedupe, one bbolt transaction per
	// call: what a tool server without idem does (and what idem mcp-proxy
	// stands in front of).
	Idem bool `json:"idem"`
	// CrashKey and CrashPoint, if set, kill the server with SIGKILL at
	// CrashPoint (MCPBeforeCommit or MCPAfterCommit) of the call whose
	// _meta key is CrashKey, unless the call's _meta has
	// idemmcp.MetaRecovered true: a call re-executed after the kill (by
	// idem mcp-proxy, which restarts the server with the same arguments)
	// runs to its end.
	CrashKey   string `json:"crash_key,omitempty"`
	CrashPoint string `json:"crash_point,omitempty"`
}

// ServeMCP serves the retail tools over t until the client disconnects or
// ctx ends.
func ServeMCP(ctx context.Context, cfg ServeConfig, t mcp.Transport) error {
	s := mcp.NewServer(&mcp.Implementation{Name: "taubench-retail", Version: "v1"}, nil)
	crash := func(req *mcp.CallToolRequest, point string) {
		if cfg.CrashKey != "" && cfg.CrashPoint == point && metaKey(req) == cfg.CrashKey && !recovered(req) {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way
		}
	}
	var closeStore func() error
	if cfg.Idem {
		e, err := idem.Open(cfg.DB, &idem.Options{PruneInterval: -1})
		if err != nil {
			return err
		}
		closeStore = e.Close
		m := idemmcp.New(e, nil)
		for _, tool := range toolList {
			def := mcpTool(tool)
			if !tool.Write {
				idemmcp.AddTool(s, m, def, func(_ context.Context, _ *mcp.CallToolRequest, in map[string]any) (*mcp.CallToolResult, any, error) {
					var out string
					err := e.View(func(tx *bbolt.Tx) error {
						var err error
						out, err = tool.Run(BoltTx{tx}, in)
						return err
					})
					return textResult(out), nil, err
				}, nil)
				continue
			}
			idemmcp.AddTxTool(s, m, idem.TxDoer[*idem.Tx](e), def,
				func(_ context.Context, req *mcp.CallToolRequest, in map[string]any, tx *idem.Tx) (*mcp.CallToolResult, any, error) {
					out, err := runWrite(tool, tx, req, in)
					if err != nil {
						return nil, nil, err
					}
					crash(req, MCPBeforeCommit)
					return textResult(out), nil, nil
				}, nil)
		}
		s.AddReceivingMiddleware(m.Wrap)
	} else {
		db, err := bbolt.Open(cfg.DB, 0o600, nil)
		if err != nil {
			return err
		}
		closeStore = db.Close
		for _, tool := range toolList {
			mcp.AddTool(s, mcpTool(tool), func(_ context.Context, req *mcp.CallToolRequest, in map[string]any) (*mcp.CallToolResult, any, error) {
				var out string
				run := func(tx *bbolt.Tx) error {
					var err error
					if tool.Write {
						out, err = runWrite(tool, BoltTx{tx}, req, in)
						if err == nil {
							crash(req, MCPBeforeCommit)
						}
						return err
					}
					out, err = tool.Run(BoltTx{tx}, in)
					return err
				}
				var err error
				if tool.Write {
					err = db.Update(run)
				} else {
					err = db.View(run)
				}
				return textResult(out), nil, err
			})
		}
	}
	// Outermost: after the call committed, before its answer is sent.
	s.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			res, err := next(ctx, method, req)
			if r, ok := req.(*mcp.CallToolRequest); ok {
				crash(r, MCPAfterCommit)
			}
			return res, err
		}
	})
	err := s.Run(ctx, t)
	if cerr := closeStore(); err == nil {
		err = cerr
	}
	return err
}

// mcpTool is the MCP definition of a retail tool: any object of keyword
// arguments (the tool answers a bad one with the reference's TypeError
// text), and read-only for the read tools.
func mcpTool(t Tool) *mcp.Tool {
	return &mcp.Tool{
		Name:        t.Name,
		Description: "τ-bench retail tool " + t.Name + "(" + strings.Join(t.Params, ", ") + ")",
		InputSchema: json.RawMessage(`{"type":"object"}`),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: !t.Write},
	}
}

func textResult(out string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: out}}}
}

// runWrite runs a write tool in b and counts its effect under the call's
// key in the same transaction; a recovered call (recovered) also marks its
// key in RecoveredBucket.
func runWrite(t Tool, b Buckets, req *mcp.CallToolRequest, in map[string]any) (string, error) {
	out, err := t.Run(b, in)
	if err != nil {
		return out, err
	}
	if recovered(req) {
		rb, err := b.Bucket([]byte(RecoveredBucket))
		if err != nil {
			return "", err
		}
		if err := rb.Put([]byte(metaKey(req)), []byte{1}); err != nil {
			return "", err
		}
	}
	if strings.HasPrefix(out, "Error") {
		return out, nil
	}
	bkt, err := b.Bucket([]byte(EffectsBucket))
	if err != nil {
		return "", err
	}
	k := []byte(metaKey(req))
	var n uint64
	if v := bkt.Get(k); len(v) == 8 {
		n = binary.BigEndian.Uint64(v)
	}
	return out, bkt.Put(k, binary.BigEndian.AppendUint64(nil, n+1))
}

// recovered reports whether the call's _meta has idemmcp.MetaRecovered true.
func recovered(req *mcp.CallToolRequest) bool {
	r, _ := req.Params.Meta[idemmcp.MetaRecovered].(bool)
	return r
}

func metaKey(req *mcp.CallToolRequest) string {
	k, _ := req.Params.Meta[idemmcp.MetaKey].(string)
	return k
}

// Tool server children.

// MCPServerChildCommand is the first argument of the MCP tool server child
// that RunMCP starts: the runner starts Config.Executable with it and a
// ServeConfig (a JSON document) as its arguments.
const MCPServerChildCommand = "taubench-mcp-server-child"

// MCPServerCommand returns the command that runs the retail tool server of
// cfg over stdio: exe (a program that calls ChildMain first thing, as this
// package's tests do, or the idem CLI, whose hidden subcommand calls
// RunMCPServerChild) re-executed with MCPServerChildCommand and the
// configuration as its arguments. The caller may set the command's Stderr.
func MCPServerCommand(exe string, cfg ServeConfig) (*exec.Cmd, error) {
	spec, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	return exec.Command(exe, MCPServerChildCommand, string(spec)), nil
}

// RunMCPServerChild serves the retail tools over stdio with the ServeConfig
// raw (JSON), until stdin closes: the body of the MCP tool server child.
func RunMCPServerChild(raw string) error {
	var cfg ServeConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		return fmt.Errorf("taubench tool server: configuration: %w", err)
	}
	err := ServeMCP(context.Background(), cfg, &mcp.StdioTransport{})
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// mcpServerMain serves the tools over stdio if args make this process a
// tool server child, and exits then.
func mcpServerMain(args []string) {
	if len(args) != 2 || args[0] != MCPServerChildCommand {
		return
	}
	err := RunMCPServerChild(args[1])
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "taubench tool server:", err)
		os.Exit(3)
	}
	os.Exit(0)
}

// SeedFile creates the bbolt file at path holding the retail data of
// dataDir (orders.json, users.json, products.json), replacing the retail
// buckets of an existing file.
func SeedFile(path, dataDir string) error { return seedFile(path, dataDir) }
