// Package mcpproxy is `idem mcp-proxy`: a stdio MCP proxy that puts an idem
// engine in front of any stdio MCP server, in any language.
//
// The proxy starts the server as its child process and relays JSON-RPC
// messages, one a line (the MCP stdio transport), in both directions: every
// message is passed on with its bytes unchanged (initialize, tools/list,
// notifications, progress, cancellation, sampling, elicitation, anything the
// proxy does not know), except a tools/call of a protected tool (Config),
// which goes through Doer.Do:
//
//   - The idempotency key is params._meta["io.github.idemkit/idempotency-key"]
//     (MetaKey, or the name Config.MetaKey gives), a string, or a natural
//     key over chosen arguments (Tool.KeyArgs). The JSON-RPC id is never the
//     key: a retry has a new id.
//   - The fingerprint is idemmcp.Fingerprint's: the tool's name and its
//     arguments as parsed JSON (key order ignored, numbers compared as
//     decimals), plus inputResponses and requestState for a continuation;
//     never _meta.
//   - The first call is sent to the server under an id of the proxy's own
//     ("io.github.idemkit/mcp-proxy:N"; clients must not use ids with that
//     prefix), with MetaKey, MetaRecovered and MetaAttempt set in its _meta,
//     so that a key-aware server can reconcile a recovered call. The server's
//     answer (a result, an isError result or a JSON-RPC error) is recorded and
//     sent to the client under the client's id.
//   - A retry with the key is answered from the record under the NEW request's
//     id, with MetaReplayed true in the result's _meta; the server sees nothing.
//     Another call with the same key waits for the first, at most MaxWait
//     (or not at all, by the engine's InFlightPolicy), and is then refused
//     with idemmcp.CodeInProgress; other arguments with the key are refused
//     with idemmcp.CodeConflict. A continuation of a multi-round-trip call
//     (inputResponses or requestState) is a call of its own, as in idemmcp:
//     its key is idem.KeyOf("idemmcp-continuation", key, requestState).
//   - Not recorded: JSON-RPC errors that say the server refused the request
//     before running it (parse error, invalid request, method not found,
//     invalid params: -32700, -32600, -32601, -32602), a result that is not
//     final (resultType input_required, non-empty inputRequests, or a task),
//     and a result whose _meta has MetaRetryable true (a key-aware server's
//     transient failure), and the isError results by which the Go and
//     TypeScript SDKs refuse arguments before the handler runs (sdkRefusals:
//     recognised by their text; a server of another SDK that answers a schema
//     failure as an isError result has it recorded). They are answered and
//     the key stays free; a call that waited for one runs on its own (it
//     gets no copy of an answer that was not recorded).
//   - An answer over the engine's MaxResponseSize is sent to the caller whose
//     call ran, not recorded: the key is done with idem.ErrResponseTooLarge,
//     and a retry gets an internal error (-32603) instead of a replay.
//   - A cancellation (notifications/cancelled) of a protected call is never
//     forwarded, neither the first caller's nor a waiter's: the call runs to
//     its end so its outcome is recorded, and a retry replays it instead of
//     meeting an unknown outcome. The cancelled request gets no response
//     (the receiver of a cancellation should not answer it).
//   - A JSON-RPC batch (an array of messages, which the 2025-03-26 protocol
//     allows) that holds a tools/call of a protected tool is refused: each
//     request in it gets an invalid-request error (-32600), and nothing of it
//     reaches the server. Other batches are relayed as they are. A
//     tools/call of a protected tool without an id (a notification) is
//     dropped with a warning, and one with a null id gets an invalid-request
//     error: neither can be recorded and answered as a call.
//
// Calls of tools not in the configuration are relayed unprotected, with a
// warning on stderr the first time each one is called, unless the server's
// tools/list marked it read-only (annotations.readOnlyHint). Task-augmented
// calls (params.task) are relayed unprotected with a warning. A tool of the
// configuration that the server's tools/list does not list (over all its
// pages) is reported on stderr once, when the last page arrives: a name
// mistyped in the file or in --tool.
//
// # When the server dies
//
// The proxy restarts it, once the session was initialized: it starts the
// command again, replays the client's initialize request and initialized
// notification to it (under its own id, the answer is not relayed), and goes
// on. A protected call that was running is an interrupted execution: the
// proxy calls Do again on the new server, which re-executes it with
// MetaRecovered true and MetaAttempt one higher (under the engine's default
// RecoverReexecute policy), so the client gets an answer and the server can
// reconcile with the key (under RecoverRefuse the client gets
// idemmcp.CodeIncomplete instead, until an operator resolves the key). After
// MaxRounds server deaths in one call the client gets CodeServerDied and the
// record stays interrupted. A relayed request
// (an unprotected call, a resources/read) that was running is answered with
// CodeServerDied and not retried. State the server kept for the session
// (subscriptions, logging level, resources it created) is lost with it.
//
// The proxy exits with an error instead if the server dies before the
// session was initialized (before the first server answered initialize, or
// server/discover for the stateless protocol of 2026-07-28, or a restarted
// one the replayed initialize): a server that cannot start is not restarted
// in a loop. A stateless session (server/discover) has no handshake to
// replay; its subscriptions/listen stream ends with CodeServerDied.
//
// The child gets Pdeathsig (SIGKILL) on Linux, so it dies with the proxy.
package mcpproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemmcp"
)

// The _meta names the proxy reads and writes: idemmcp's (reverse-DNS of the
// project's home, as the MCP specification asks of _meta prefixes).
const (
	// MetaKey is the idempotency key in a tools/call's params._meta: a JSON
	// string of 1 to idem.MaxKeyLen bytes. The proxy sets it, on the request
	// it sends to the server, to the key it used (a natural key too).
	MetaKey = idemmcp.MetaKey
	// MetaRecovered, a boolean in the _meta of the request sent to the server,
	// is true when the call re-executes an interrupted one (a server killed
	// mid-call): its effect may have happened, reconcile by MetaKey.
	MetaRecovered = idemmcp.MetaRecovered
	// MetaAttempt, a number in the same _meta, is the execution's attempt,
	// from 1.
	MetaAttempt = "io.github.idemkit/attempt"
	// MetaReplayed is true in the _meta of a result answered from the record.
	MetaReplayed = idemmcp.MetaReplayed
	// MetaRetryable, true in the _meta of a server's result, marks a transient
	// failure whose effect did not happen: the result is not recorded.
	MetaRetryable = "io.github.idemkit/retryable"
)

// The proxy's refusals are idemmcp's (idemmcp.RefusalError): the same codes
// and data {"type", "retryAfter"} as the middleware's, and idemmcp.RefusalOf
// reads them. One more error is the proxy's own:
const (
	// CodeServerDied: the server process died during the call; data.type
	// is TypeServerDied. For a protected call the record stays interrupted (a
	// retry with the key re-executes it, recovered); a relayed request was
	// not retried.
	CodeServerDied = -32066
	// TypeServerDied is the data.type of CodeServerDied.
	TypeServerDied = "mcp_server_died"
)

// DefaultMaxWait bounds how long a duplicate waits for the first call with
// its key (Proxy.MaxWait) before it is refused as in progress: idemmcp's.
const DefaultMaxWait = idemmcp.DefaultMaxWait

// MaxRounds is how many times one protected call is executed on a server that
// dies during it before the client gets CodeServerDied.
const MaxRounds = 3

// initTimeout bounds the wait for a restarted server's answer to the replayed
// initialize request.
const initTimeout = 30 * time.Second

// stopGrace is how long the proxy waits, at the end of the session, for the
// server to exit after its stdin closed, and then after SIGTERM, before
// SIGKILL (the MCP stdio transport's shutdown).
const stopGrace = 5 * time.Second

// internalPrefix starts the ids of the requests the proxy itself sends.
const internalPrefix = "io.github.idemkit/mcp-proxy:"

// Proxy relays one MCP session between a client (Serve's in and out) and a
// server it starts (Command). Set the fields, then call Serve once.
type Proxy struct {
	// Engine records the protected calls: an *idem.Engine, or any backend's.
	Engine idem.Doer
	// Config says which tools are protected; nil protects none.
	Config *Config
	// Command is the server's argv: Command[0] is looked up in PATH.
	Command []string
	// Env is the server's environment; nil means the proxy's.
	Env []string
	// Stderr receives the proxy's warnings (one line each, prefixed
	// "idem mcp-proxy: ") and the server's stderr. Nil means os.Stderr.
	Stderr io.Writer
	// MaxWait bounds, wall-clock, how long a duplicate of a running call
	// waits for its outcome before it is refused with
	// idemmcp.CodeInProgress (it never blocks forever); the first call itself
	// runs as long as the server takes. Zero means DefaultMaxWait.
	MaxWait time.Duration
}

// Serve runs the session: it starts the server, relays messages between it
// and the client (in: the client's messages; out: the messages to it) and
// returns when the session ends:
//
//   - nil when in ends (EOF: the client closed the session): the proxy waits
//     for the protected calls in flight to be recorded, closes the server's
//     stdin, and waits for it to exit (SIGTERM, then SIGKILL, after
//     5 seconds each);
//   - ctx.Err() when ctx ends: the server is killed;
//   - an error when the server cannot be started, or dies before the session
//     was initialized (see the package documentation); and, at the end of
//     the session, the first failed write to out (after which answers are
//     dropped, while the protected calls in flight still run to their end
//     and are recorded).
//
// Serve reads in from a goroutine of its own, which ends when in does.
func (p *Proxy) Serve(ctx context.Context, in io.Reader, out io.Writer) error {
	if len(p.Command) == 0 {
		return errors.New("mcp-proxy: no server command")
	}
	if p.Engine == nil {
		return errors.New("mcp-proxy: no engine")
	}
	s := &session{
		p: p, cfg: p.Config, out: out, stderr: p.Stderr,
		pending: map[string]pending{}, protected: map[string]*protectedCall{},
		internal: map[string]chan []byte{}, readOnly: map[string]bool{}, listed: map[string]bool{}, warned: map[string]bool{},
		ready: make(chan struct{}), done: make(chan struct{}),
	}
	if s.cfg == nil {
		s.cfg = &Config{}
	}
	if s.stderr == nil {
		s.stderr = os.Stderr
	}
	c, err := s.start(1)
	if err != nil {
		return err
	}
	s.install(c)

	eof := make(chan error, 1)
	go func() { eof <- s.readClient(in) }()
	select {
	case err := <-eof:
		if err != nil {
			s.fail(fmt.Errorf("mcp-proxy: reading the client: %w", err))
			break
		}
		s.shutdown(ctx)
		s.outMu.Lock()
		if err := s.outErr; err != nil {
			s.fail(err)
		}
		s.outMu.Unlock()
	case <-s.done:
	case <-ctx.Done():
		s.fail(ctx.Err())
	}
	s.killChild()
	return s.err()
}
