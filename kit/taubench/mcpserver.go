package taubench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"

	"github.com/modelcontextprotocol/go-sdk/mcp"

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

// ServeConfig is one MCP server of the 16 retail tools over a seeded file or
// Postgres schema.
type ServeConfig struct {
	// DB is the bbolt file (seeded with Seed). With Schema set, no file is
	// opened: DB is then only the base of the names of files a command
	// puts beside it (MCPOptions.Command).
	DB string `json:"db"`
	// Schema, if set, is the Postgres schema of the retail tables (and, with
	// Idem, of idempg's) on the server PG names: the Postgres backend.
	Schema string `json:"schema,omitempty"`
	// IdemSchema is the schema of idempg's tables, with Schema and Idem;
	// empty means Schema.
	IdemSchema string `json:"idem_schema,omitempty"`
	// PG is the Postgres DSN for Schema. It is not part of the JSON: a tool
	// server child reads it from its environment (IDEM_TAUBENCH_CHILD_PG).
	PG string `json:"-"`
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
	db, err := openDB(ctx, place{Path: cfg.DB, Schema: cfg.Schema, IdemSchema: cfg.IdemSchema}, cfg.Idem, cfg.PG)
	if err != nil {
		return err
	}
	read := func(tool Tool, in map[string]any) (string, error) {
		var out string
		err := db.read(ctx, func(st Store) error {
			var err error
			out, err = tool.Run(st, in)
			return err
		})
		return out, err
	}
	if cfg.Idem {
		m := idemmcp.New(db.doer(), nil)
		for _, tool := range toolList {
			def := mcpTool(tool)
			if !tool.Write {
				idemmcp.AddTool(s, m, def, func(_ context.Context, _ *mcp.CallToolRequest, in map[string]any) (*mcp.CallToolResult, any, error) {
					out, err := read(tool, in)
					return textResult(out), nil, err
				}, nil)
				continue
			}
			db.addTxTool(s, m, def, func(_ context.Context, req *mcp.CallToolRequest, in map[string]any, st Store) (*mcp.CallToolResult, any, error) {
				out, err := runWrite(tool, st, req, in)
				if err != nil {
					return nil, nil, err
				}
				crash(req, MCPBeforeCommit)
				return textResult(out), nil, nil
			})
		}
		s.AddReceivingMiddleware(m.Wrap)
	} else {
		for _, tool := range toolList {
			mcp.AddTool(s, mcpTool(tool), func(ctx context.Context, req *mcp.CallToolRequest, in map[string]any) (*mcp.CallToolResult, any, error) {
				if !tool.Write {
					out, err := read(tool, in)
					return textResult(out), nil, err
				}
				var out string
				err := db.write(ctx, func(st Store) error {
					var err error
					if out, err = runWrite(tool, st, req, in); err == nil {
						crash(req, MCPBeforeCommit)
					}
					return err
				})
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
	err = s.Run(ctx, t)
	if cerr := db.close(); err == nil {
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

// runWrite runs a write tool in st and counts its effect under the call's
// key in the same transaction (EffectsBucket, PgEffects); a recovered call
// (recovered) also marks its key (RecoveredBucket, PgRecovered).
func runWrite(t Tool, st Store, req *mcp.CallToolRequest, in map[string]any) (string, error) {
	ls, ok := st.(ledgerStore)
	if !ok {
		return "", fmt.Errorf("taubench: %T keeps no effect counts", st)
	}
	out, err := t.Run(st, in)
	if err != nil {
		return out, err
	}
	if recovered(req) {
		if err := ls.markRecovered(metaKey(req)); err != nil {
			return "", err
		}
	}
	if strings.HasPrefix(out, "Error") {
		return out, nil
	}
	return out, ls.countEffect(metaKey(req))
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
	if cfg.Schema != "" {
		cfg.PG = os.Getenv(envChildPG)
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
