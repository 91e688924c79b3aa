package main

import (
	"errors"
	"fmt"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/mcpproxy"
)

func newMCPProxyCmd(a *app) *cobra.Command {
	var config, inFlight, metaKey string
	var tools []string
	var maxWait time.Duration
	c := &cobra.Command{
		Use:   "mcp-proxy [--config FILE] [--tool NAME]... [--meta-key NAME] -- COMMAND [ARG...]",
		Short: "Run a stdio MCP server behind idem: its side-effecting tool calls run once per idempotency key",
		Long: `mcp-proxy starts COMMAND, a stdio MCP server in any language, as its child and
relays the MCP session between it and the client on its own stdin and stdout.
Every message passes unchanged, except tools/call of the tools the --config
file protects: each runs once per idempotency key (params._meta
"io.github.idemkit/idempotency-key", or a natural key over chosen arguments),
is recorded in the --db file (created if missing), and every retry with the key
is answered from the record, under the retry's id, with
"io.github.idemkit/replayed": true in the result's _meta. A key reused with
other arguments is refused (JSON-RPC error -32062, idempotency_key_conflict;
the refusals are idemmcp's, as from a Go server with the idemmcp middleware).
A duplicate of a call still running waits for its answer, at most --max-wait,
then gets -32063 (idempotency_key_in_progress) with retryAfter.

The config file (YAML or JSON):

  tools:
    create_order: {}                      # the key comes from _meta
    cancel_order: {keyArgs: [order_id]}   # natural key: the tool and order_id
    get_order: {readOnly: true}           # relayed, no warning
  missingKey: refuse                      # or run (unprotected, with a warning)

  metaKey: com.example/request-id         # the key's name in _meta

--tool NAME (repeatable) protects a tool without a file, the key from _meta,
and adds to the file's tools (a tool the file protects keeps its entry; one it
marks readOnly is a usage error). --meta-key NAME reads the key from _meta
under NAME instead of "io.github.idemkit/idempotency-key", for clients of
another convention (it overrides the file's metaKey; the request sent to the
server carries the key under idem's name as well). A call of a tool not
configured runs unprotected, with a warning on stderr, unless the server
marks the tool read-only; a configured tool the server's tools/list does not
list is reported on stderr.

If the server dies, mcp-proxy restarts it, replays the session's initialize to
it, and re-executes the protected call that was running with
"io.github.idemkit/recovered": true and the key in its _meta, so that a
key-aware server can reconcile; a relayed request that was running gets an
error. A server that dies before the session is initialized ends mcp-proxy
with status 1. The server dies with mcp-proxy (Linux's Pdeathsig).`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.ArgsLenAtDash() != 0 {
				return &usageError{errors.New("put the server's command after --: idem mcp-proxy [flags] -- COMMAND [ARG...]")}
			}
			var policy idem.InFlightPolicy
			switch inFlight {
			case "wait":
				policy = idem.InFlightWait
			case "fail":
				policy = idem.InFlightFail
			default:
				return &usageError{fmt.Errorf("--in-flight must be wait or fail, not %q", inFlight)}
			}
			if maxWait <= 0 {
				return &usageError{fmt.Errorf("--max-wait must be positive, not %v", maxWait)}
			}
			cfg := &mcpproxy.Config{}
			if config != "" {
				var err error
				if cfg, err = mcpproxy.LoadConfig(config); err != nil {
					return err
				}
			}
			if cmd.Flags().Changed("meta-key") {
				if metaKey == "" {
					return &usageError{errors.New("--meta-key must not be empty")}
				}
				cfg.MetaKey = metaKey
			}
			for _, name := range tools {
				if err := cfg.Protect(name); err != nil {
					return &usageError{fmt.Errorf("--tool: %w", err)}
				}
			}
			return a.mcpProxy(cmd, cfg, policy, maxWait, args)
		},
	}
	c.Flags().StringVar(&config, "config", "", "the tools to protect (YAML or JSON); none: every call runs unprotected, with a warning")
	c.Flags().StringArrayVar(&tools, "tool", nil, "protect the tool NAME, the key from _meta (repeatable; added to --config's tools)")
	c.Flags().StringVar(&metaKey, "meta-key", mcpproxy.MetaKey, "the name of the idempotency key in a tools/call's params._meta")
	c.Flags().StringVar(&inFlight, "in-flight", "wait", "a duplicate of a call still running: wait for its answer, or fail at once (error -32063 with retryAfter)")
	c.Flags().DurationVar(&maxWait, "max-wait", mcpproxy.DefaultMaxWait, "the longest a duplicate waits for the first call with its key before error -32063")
	return c
}

func (a *app) mcpProxy(cmd *cobra.Command, cfg *mcpproxy.Config, inFlight idem.InFlightPolicy, maxWait time.Duration, argv []string) (err error) {
	recovery, _ := a.recoveryPolicy()
	e, err := idem.OpenFile(a.db, &idem.BoltOptions{LockTimeout: lockTimeout}, &idem.Options{
		Retention: a.retention,
		Recovery:  recovery,
		InFlight:  inFlight,
	})
	if err != nil {
		return openError(a.db, err)
	}
	defer closeEngine(e, &err)
	// A client that goes away must not kill the proxy with SIGPIPE on its
	// next write to stdout: the calls in flight finish and are recorded.
	signal.Ignore(syscall.SIGPIPE)
	p := &mcpproxy.Proxy{Engine: e, Config: cfg, Command: argv, Stderr: a.stderr, MaxWait: maxWait}
	err = p.Serve(cmd.Context(), a.stdin, a.stdout)
	if err != nil && cmd.Context().Err() != nil && errors.Is(err, cmd.Context().Err()) {
		return nil // SIGINT or SIGTERM: the server was killed, the records are kept
	}
	return err
}
