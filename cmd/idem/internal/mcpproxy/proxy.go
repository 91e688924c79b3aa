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
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemcore"
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

// session is the state of one Serve.
type session struct {
	p      *Proxy
	cfg    *Config
	stderr io.Writer

	outMu  sync.Mutex
	out    io.Writer
	outErr error // the first failed write to out

	nextID atomic.Int64
	calls  sync.WaitGroup // the protected calls in flight

	mu          sync.Mutex
	child       *child        // the live server; nil while it restarts
	ready       chan struct{} // closed when child is set
	initReq     []byte        // the client's initialize request
	initNote    []byte        // the client's notifications/initialized
	initialized bool          // the server answered initialize or server/discover
	closing     bool          // the session ends: no restart
	pending     map[string]pending
	protected   map[string]*protectedCall
	internal    map[string]chan []byte
	readOnly    map[string]bool // tools/list's readOnlyHint, by tool
	listed      map[string]bool // every tool a tools/list page named
	warned      map[string]bool
	fatal       error
	done        chan struct{} // closed with fatal set
}

// pending is a client request relayed to server generation gen.
type pending struct {
	method string
	gen    int
}

// protectedCall is a protected tools/call in flight.
type protectedCall struct {
	cancelled atomic.Bool // the client cancelled it: no response
}

// idKey is the map key of a JSON-RPC id: a string id re-encoded (so that
// "a\/b" and "a/b" are one id), a number's JSON text.
func idKey(id json.RawMessage) string {
	id = bytes.TrimSpace(id)
	var str string
	if len(id) > 0 && id[0] == '"' && json.Unmarshal(id, &str) == nil {
		return string(jsonString(str))
	}
	return string(id)
}

// header is what the proxy reads of every message.
type header struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
}

func (h *header) hasID() bool { return !isNull(h.ID) }

// readClient relays the client's messages until in ends; it returns nil at
// EOF.
func (s *session) readClient(in io.Reader) error {
	r := bufio.NewReader(in)
	for {
		line, err := r.ReadBytes('\n')
		if msg := bytes.TrimSpace(line); len(msg) > 0 {
			s.fromClient(msg)
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if s.isDone() {
			return nil
		}
	}
}

func (s *session) fromClient(msg []byte) {
	if msg[0] == '[' && s.refuseBatch(msg) {
		return
	}
	var h header
	if json.Unmarshal(msg, &h) != nil {
		s.relay(msg, nil, "") // not ours to judge: the server answers it
		return
	}
	switch {
	case h.Method == "" && h.hasID():
		// The client's answer to a server's request (sampling, elicitation,
		// roots): for the live server only.
		s.mu.Lock()
		c := s.child
		ok := c != nil && c.requests[idKey(h.ID)]
		if ok {
			delete(c.requests, idKey(h.ID))
		}
		s.mu.Unlock()
		if ok {
			c.send(msg)
		}
	case h.Method == "tools/call" && h.hasID():
		s.toolsCall(msg, &h)
	case h.Method == "tools/call" && s.protects(h.Params):
		// No id (a notification) or a null one: it cannot be recorded as
		// a call nor answered under its own id, and relayed it would run
		// unprotected.
		s.warn("a tools/call of a protected tool without an id was not relayed")
		if h.ID != nil {
			s.writeClient(errorResponse(h.ID, jsonrpc.CodeInvalidRequest, "",
				"a tools/call of a protected tool needs an id (not null)", nil))
		}
	case h.Method == "notifications/cancelled":
		var p struct {
			RequestID json.RawMessage `json:"requestId"`
		}
		_ = json.Unmarshal(h.Params, &p)
		s.mu.Lock()
		pc := s.protected[idKey(p.RequestID)]
		s.mu.Unlock()
		if pc != nil {
			pc.cancelled.Store(true)
			return
		}
		s.relay(msg, nil, "")
	case h.hasID():
		if h.Method == "initialize" {
			s.mu.Lock()
			s.initReq = bytes.Clone(msg)
			s.mu.Unlock()
		}
		s.relay(msg, h.ID, h.Method)
	default:
		if h.Method == "notifications/initialized" {
			s.mu.Lock()
			s.initNote = bytes.Clone(msg)
			s.mu.Unlock()
		}
		s.relay(msg, nil, "")
	}
}

// refuseBatch answers a JSON-RPC batch (an array of messages, which the
// 2025-03-26 protocol allows) that holds a tools/call of a protected tool:
// each request in it gets an invalid-request error and nothing reaches the
// server, which would otherwise run its calls unprotected. It reports false,
// and does nothing, for any other batch, which is relayed as it is.
func (s *session) refuseBatch(msg []byte) bool {
	var batch []json.RawMessage
	if json.Unmarshal(msg, &batch) != nil {
		return false
	}
	protected := false
	for _, m := range batch {
		var h header
		if json.Unmarshal(m, &h) == nil && h.Method == "tools/call" && s.protects(h.Params) {
			protected = true
		}
	}
	if !protected {
		return false
	}
	var answers [][]byte
	for _, m := range batch {
		var h header
		if json.Unmarshal(m, &h) != nil || !h.hasID() || h.Method == "" {
			continue // a notification, or an answer, gets no answer
		}
		answers = append(answers, errorResponse(h.ID, jsonrpc.CodeInvalidRequest, "",
			"a batch that holds a tools/call of a protected tool is refused: send each request on its own", nil))
	}
	if len(answers) > 0 {
		s.writeClient(append(append([]byte{'['}, bytes.Join(answers, []byte{','})...), ']'))
	}
	return true
}

// protects reports whether params (of a tools/call) name a tool the
// configuration protects.
func (s *session) protects(params json.RawMessage) bool {
	var p struct {
		Name string `json:"name"`
	}
	if json.Unmarshal(params, &p) != nil {
		return false
	}
	tool, ok := s.cfg.Tools[p.Name]
	return ok && !tool.ReadOnly
}

// relay sends msg to the live server as it is, waiting for a restart if
// need be; a request (id not nil) is remembered until its answer, so that
// the client gets CodeServerDied if the server dies first.
func (s *session) relay(msg []byte, id json.RawMessage, method string) {
	c := s.liveChild(func(c *child) {
		if id != nil {
			s.pending[idKey(id)] = pending{method: method, gen: c.gen}
		}
	})
	if c != nil {
		c.send(msg)
	}
}

// liveChild waits for a live server and returns it, after running register
// (if not nil) under the session's lock with it; nil if the session failed.
func (s *session) liveChild(register func(*child)) *child {
	for {
		s.mu.Lock()
		if c := s.child; c != nil {
			if register != nil {
				register(c)
			}
			s.mu.Unlock()
			return c
		}
		ready := s.ready
		s.mu.Unlock()
		select {
		case <-ready:
		case <-s.done:
			return nil
		}
	}
}

// toolsCall handles a client's tools/call: relayed, refused, or run through
// the engine in a goroutine of its own.
func (s *session) toolsCall(msg []byte, h *header) {
	var params struct {
		Name      string                     `json:"name"`
		Arguments json.RawMessage            `json:"arguments"`
		Meta      map[string]json.RawMessage `json:"_meta"`
		Task      json.RawMessage            `json:"task"`
	}
	var raw mcp.CallToolParamsRaw // what idemmcp.Fingerprint reads
	if json.Unmarshal(h.Params, &params) != nil || json.Unmarshal(h.Params, &raw) != nil {
		s.relay(msg, h.ID, h.Method) // the server refuses it
		return
	}
	tool, configured := s.cfg.Tools[params.Name]
	switch {
	case !configured:
		s.mu.Lock()
		ro := s.readOnly[params.Name]
		s.mu.Unlock()
		if !ro {
			s.warnOnce("unconfigured:"+params.Name, "tool %q is not in the configuration: its calls run unprotected", params.Name)
		}
		s.relay(msg, h.ID, h.Method)
		return
	case tool.ReadOnly:
		s.relay(msg, h.ID, h.Method)
		return
	case !isNull(params.Task):
		s.warnOnce("task:"+params.Name, "task-augmented calls of %q run unprotected: the proxy records direct results only", params.Name)
		s.relay(msg, h.ID, h.Method)
		return
	}

	key, err := s.keyOf(params.Name, tool, params.Arguments, params.Meta)
	if err != nil {
		s.writeClient(refusal(h.ID, idemmcp.TypeKeyInvalid, 0, err.Error()))
		return
	}
	if key == "" {
		if s.cfg.MissingKey != MissingKeyRun {
			s.writeClient(refusal(h.ID, idemmcp.TypeKeyRequired, 0,
				fmt.Sprintf("tool %q has side effects: send an idempotency key in _meta %q", params.Name, s.cfg.KeyName())))
			return
		}
		s.warnOnce("nokey:"+params.Name, "calls of %q without an idempotency key run unprotected", params.Name)
		s.relay(msg, h.ID, h.Method)
		return
	}
	fp, err := idemmcp.Fingerprint(&raw)
	if err != nil {
		s.writeClient(errorResponse(h.ID, jsonrpc.CodeInvalidParams, "", err.Error(), nil))
		return
	}
	stored := key
	if len(raw.InputResponses) > 0 || raw.RequestState != "" {
		// A continuation is a call of its own, as in idemmcp: its round may
		// perform the effect, and it must not meet the first round's key.
		stored = idem.KeyOf("idemmcp-continuation", key, raw.RequestState)
	}
	pc := &protectedCall{}
	s.mu.Lock()
	s.protected[idKey(h.ID)] = pc
	s.mu.Unlock()
	s.calls.Add(1)
	go s.runProtected(msg, bytes.Clone(h.ID), key, stored, fp, pc)
}

// keyOf returns the call's idempotency key: natural (Tool.KeyArgs) or from
// _meta; "" if there is none (no _meta key, or a KeyArgs argument absent or
// null, as in idemmcp).
func (s *session) keyOf(name string, tool Tool, args json.RawMessage, meta map[string]json.RawMessage) (string, error) {
	if len(tool.KeyArgs) > 0 {
		var obj map[string]json.RawMessage
		if !isNull(args) {
			if err := json.Unmarshal(args, &obj); err != nil {
				return "", fmt.Errorf("arguments of %q: %w", name, err)
			}
		}
		parts := []string{name}
		for _, a := range tool.KeyArgs {
			v := obj[a]
			if isNull(v) {
				return "", nil
			}
			c, err := Canonical(v)
			if err != nil {
				return "", fmt.Errorf("argument %q of %q: %w", a, name, err)
			}
			parts = append(parts, string(c))
		}
		return idem.KeyOf(parts...), nil
	}
	keyName := s.cfg.KeyName()
	raw, ok := meta[keyName]
	if !ok || isNull(raw) {
		return "", nil
	}
	var key string
	if err := json.Unmarshal(raw, &key); err != nil {
		return "", fmt.Errorf("_meta %q must be a string", keyName)
	}
	// Checked here, not only by the engine: a continuation's stored key is
	// a hash of it, which the engine cannot check.
	if err := idem.ValidateKey(key); err != nil {
		return "", err
	}
	return key, nil
}

// runProtected runs one protected call through the engine, under the key
// stored (key, or a continuation's), and answers the client.
func (s *session) runProtected(msg, id json.RawMessage, key, stored string, fp []byte, pc *protectedCall) {
	defer s.calls.Done()
	defer func() {
		s.mu.Lock()
		delete(s.protected, idKey(id))
		s.mu.Unlock()
	}()
	maxWait := s.p.MaxWait
	if maxWait <= 0 {
		maxWait = DefaultMaxWait
	}
	var answer []byte
	for round := 1; ; round++ {
		c := s.liveChild(nil)
		if c == nil {
			return // the session failed: nobody to answer
		}
		// The deadline bounds a duplicate's wait; the first call's fn
		// outlives it (execute), so its outcome is always recorded.
		ctx, cancel := context.WithTimeout(c.ctx, maxWait)
		var ran, notRecorded []byte // the server's answer to this call's own execution
		res, err := s.p.Engine.Do(ctx, stored, fp, func(ctx context.Context) ([]byte, error) {
			resp, err := s.execute(ctx, c, msg, key)
			switch {
			case err == nil:
				ran = resp
			case errors.Is(err, idem.ErrRetryable):
				notRecorded = resp // answered, not recorded: the Result carries none
			}
			return resp, err
		})
		cancel()
		ref, refused := idemcore.RefusalOf(err)
		switch {
		case err == nil:
			answer, err = reply(res.Response, id, res.Replayed)
		case errors.Is(err, idem.ErrRetryable) && notRecorded != nil:
			answer, err = reply(notRecorded, id, false)
		case errors.Is(err, idem.ErrRetryable) && round < MaxRounds:
			// The call this one waited for was answered but not recorded:
			// the key is free, so this call runs on its own.
			continue
		case errors.Is(err, idem.ErrResponseTooLarge) && ran != nil:
			// The server answered, over the engine's limit: its caller
			// gets the answer; retries get the stored error.
			answer, err = reply(ran, id, false)
		case refused && ref.Kind != idemcore.RefusalUnavailable:
			answer, err = refusalOf(id, idemmcp.RefusalFor(ref, idem.DefaultRetryAfter, err)), nil
		case c.ctx.Err() != nil && !s.isDone() && round < MaxRounds:
			continue // the server died: run it again on the next one
		case c.ctx.Err() != nil:
			answer = errorResponse(id, CodeServerDied, TypeServerDied,
				fmt.Sprintf("the server process died during the call %d times: its outcome is unknown; a retry with the same key re-executes it", round), nil)
		case errors.Is(err, context.DeadlineExceeded):
			answer = refusal(id, idemmcp.TypeInProgress, idem.DefaultRetryAfter,
				fmt.Sprintf("the first call with this idempotency key still runs after %v", maxWait))
		default:
			// The client learns what idemmcp's middleware says; the
			// details (the key, the file) go to the operator's log.
			s.warn("the idempotency store failed: %v", err)
			if ran != nil {
				// The server ran the call, but its outcome was not
				// recorded: its caller gets the answer (the effect is
				// done); the key stays started, for the recovery policy.
				answer, err = reply(ran, id, false)
				break
			}
			answer, err = refusalOf(id, idemmcp.RefusalFor(idemcore.RefusalUnavailable.Refusal(), idem.DefaultRetryAfter, err)), nil
		}
		if err != nil && answer == nil {
			answer = refusal(id, idemmcp.TypeUnavailable, 0, "the recorded answer does not decode: "+reason(err))
		}
		break
	}
	if !pc.cancelled.Load() {
		s.writeClient(answer)
	}
}

// execute is the fn of a protected call: it sends the call to server c under
// an id of the proxy's own, with the key, the attempt and the recovered flag
// in _meta, and returns the server's answer, or a context error if c dies or
// the engine closes first.
func (s *session) execute(ctx context.Context, c *child, msg []byte, key string) ([]byte, error) {
	call, _ := idem.CallFrom(ctx)
	iid := internalPrefix + strconv.FormatInt(s.nextID.Add(1), 10)
	req, err := rewriteCall(msg, iid, key, call)
	if err != nil {
		return nil, fmt.Errorf("rewriting the call: %w", err)
	}
	ch := s.expect(iid)
	defer s.unexpect(iid)
	c.send(req)
	done := ctx.Done()
	for {
		select {
		case resp := <-ch:
			return resp, verdict(resp)
		case <-c.ctx.Done():
			// The server died: an interrupted execution. fn's context
			// descends from c.ctx, but the context package closes a
			// parent's Done before it cancels the children, so wait for
			// fn's own end: returned earlier, c.ctx's error would be
			// taken for the outcome of a call whose context is live, and
			// recorded.
			<-ctx.Done()
			return nil, ctx.Err()
		case <-done:
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				done = nil // MaxWait bounds the duplicates, not this call
				continue
			}
			return nil, ctx.Err() // the engine closes
		}
	}
}

// Errors marking an answer the proxy does not record.
var (
	errRefused  = errors.New("the server refused the request before running it")
	errNotFinal = errors.New("the result is not final")
	errServer   = errors.New("the server marked the failure retryable")
)

// refusedCodes are the JSON-RPC errors of a request the server did not run.
var refusedCodes = map[int]bool{-32700: true, -32600: true, -32601: true, -32602: true}

// verdict says whether the server's answer resp is recorded (nil) or not (an
// error wrapped by idem.Retryable).
func verdict(resp []byte) error {
	var m struct {
		Result json.RawMessage `json:"result"`
		Error  *struct {
			Code int `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(resp, &m); err != nil {
		return nil // relayed as it came; recorded as it came
	}
	if m.Error != nil {
		if refusedCodes[m.Error.Code] {
			return idem.Retryable(errRefused)
		}
		return nil
	}
	var r struct {
		IsError bool `json:"isError"`
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
		ResultType    string                     `json:"resultType"`
		InputRequests json.RawMessage            `json:"inputRequests"`
		Task          json.RawMessage            `json:"task"`
		Meta          map[string]json.RawMessage `json:"_meta"`
	}
	_ = json.Unmarshal(m.Result, &r)
	if ir := bytes.TrimSpace(r.InputRequests); !isNull(ir) && string(ir) != "[]" && string(ir) != "{}" {
		return idem.Retryable(errNotFinal)
	}
	if r.ResultType == "input_required" || !isNull(r.Task) {
		return idem.Retryable(errNotFinal)
	}
	if string(bytes.TrimSpace(r.Meta[MetaRetryable])) == "true" {
		return idem.Retryable(errServer)
	}
	if r.IsError && len(r.Content) > 0 && r.Content[0].Type == "text" {
		for _, prefix := range sdkRefusals {
			if strings.HasPrefix(r.Content[0].Text, prefix) {
				return idem.Retryable(errRefused)
			}
		}
	}
	return nil
}

// sdkRefusals start the text of the isError results by which the MCP SDKs
// refuse a call before its handler runs: go-sdk v1.8.0's schema validation
// (as idemmcp recognises it), and the TypeScript SDK's (1.32) invalid params
// and unknown tool, which it answers as isError results of its JSON-RPC error.
var sdkRefusals = []string{`validating "arguments": `, "MCP error -32602: "}

// rewriteCall gives the client's tools/call msg the id iid and sets MetaKey,
// MetaAttempt and MetaRecovered in its params._meta.
func rewriteCall(msg []byte, iid, key string, call idem.Call) ([]byte, error) {
	o, err := parseObject(msg)
	if err != nil {
		return nil, err
	}
	params, err := parseObject(o.get("params"))
	if err != nil {
		return nil, err
	}
	attempt := max(call.Attempt, 1)
	for _, kv := range []member{
		{MetaKey, jsonString(key)},
		{MetaAttempt, json.RawMessage(strconv.Itoa(attempt))},
		{MetaRecovered, json.RawMessage(strconv.FormatBool(call.Recovered))},
	} {
		if params, err = params.setIn("_meta", kv.key, kv.raw); err != nil {
			return nil, err
		}
	}
	return o.set("id", jsonString(iid)).set("params", params.bytes()).bytes(), nil
}

// reply is the stored server answer resp under the client's id; a replayed
// result gets MetaReplayed in its _meta.
func reply(resp, id json.RawMessage, replayed bool) ([]byte, error) {
	o, err := parseObject(resp)
	if err != nil {
		return nil, err
	}
	o = o.set("id", id)
	if r := o.get("result"); replayed && r != nil {
		result, err := parseObject(r)
		if err != nil {
			return nil, err
		}
		if result, err = result.setIn("_meta", MetaReplayed, json.RawMessage("true")); err != nil {
			return nil, err
		}
		o = o.set("result", result.bytes())
	}
	return o.bytes(), nil
}

// errorResponse is a JSON-RPC error answer to id; typ, if not empty, and the
// fields of extra go into its data.
func errorResponse(id json.RawMessage, code int64, typ, message string, extra map[string]any) []byte {
	e := map[string]any{"code": code, "message": "idem mcp-proxy: " + message}
	if typ != "" {
		data := map[string]any{"type": typ}
		for k, v := range extra {
			data[k] = v
		}
		e["data"] = data
	}
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "error": e})
	return b
}

// reason is err's text without the engine's "idem: op "key": " prefix of an
// *idem.OpError: a refusal's message already names what refused it
// ("idempotency: ").
func reason(err error) string {
	if oe, ok := errors.AsType[*idem.OpError](err); ok && oe.Err != nil {
		return oe.Err.Error()
	}
	return err.Error()
}

// refusal is idemmcp's refusal of type typ as the answer to id.
func refusal(id json.RawMessage, typ string, retryAfter time.Duration, message string) []byte {
	return refusalOf(id, idemmcp.RefusalError(typ, retryAfter, message))
}

// refusalOf is the JSON-RPC error we as the answer to id.
func refusalOf(id json.RawMessage, we *jsonrpc.Error) []byte {
	e := map[string]any{"code": we.Code, "message": we.Message}
	if len(we.Data) > 0 {
		e["data"] = we.Data
	}
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "error": e})
	return b
}

// expect registers a wait for the server's answer to the proxy's request iid.
func (s *session) expect(iid string) chan []byte {
	ch := make(chan []byte, 1)
	s.mu.Lock()
	s.internal[idKey(jsonString(iid))] = ch
	s.mu.Unlock()
	return ch
}

func (s *session) unexpect(iid string) {
	s.mu.Lock()
	delete(s.internal, idKey(jsonString(iid)))
	s.mu.Unlock()
}

// fromChild handles one message of server c.
func (s *session) fromChild(c *child, msg []byte) {
	var h header
	if json.Unmarshal(msg, &h) != nil {
		s.writeClient(msg)
		return
	}
	switch {
	case h.Method == "" && h.hasID():
		k := idKey(h.ID)
		s.mu.Lock()
		if ch, ok := s.internal[k]; ok {
			delete(s.internal, k)
			s.mu.Unlock()
			ch <- bytes.Clone(msg)
			return
		}
		if strings.HasPrefix(k, `"`+internalPrefix) {
			s.mu.Unlock()
			return // the answer to a request the proxy gave up on
		}
		pd, ok := s.pending[k]
		if ok {
			delete(s.pending, k)
		}
		var res struct {
			Result json.RawMessage `json:"result"`
		}
		_ = json.Unmarshal(msg, &res)
		if ok && (pd.method == "initialize" || pd.method == "server/discover") && res.Result != nil {
			s.initialized = true
		}
		if ok && pd.method == "tools/list" {
			s.noteTools(res.Result)
		}
		s.mu.Unlock()
		s.writeClient(msg)
	case h.hasID():
		s.mu.Lock()
		c.requests[idKey(h.ID)] = true
		s.mu.Unlock()
		s.writeClient(msg)
	default:
		s.writeClient(msg)
	}
}

// noteTools remembers which tools a tools/list result marks read-only and
// which it lists; on the last page (no nextCursor), it reports the tools of
// the configuration that no page listed. Called with s.mu held.
func (s *session) noteTools(result json.RawMessage) {
	var r struct {
		Tools []struct {
			Name        string `json:"name"`
			Annotations struct {
				ReadOnlyHint bool `json:"readOnlyHint"`
			} `json:"annotations"`
		} `json:"tools"`
		NextCursor string `json:"nextCursor"`
	}
	if json.Unmarshal(result, &r) != nil {
		return
	}
	for _, t := range r.Tools {
		s.readOnly[t.Name] = t.Annotations.ReadOnlyHint
		s.listed[t.Name] = true
	}
	if r.NextCursor != "" {
		return
	}
	var missing []string
	for name := range s.cfg.Tools {
		if !s.listed[name] && !s.warned["unlisted:"+name] {
			s.warned["unlisted:"+name] = true
			missing = append(missing, name)
		}
	}
	sort.Strings(missing)
	for _, name := range missing {
		s.warn("tool %q is in the configuration, but the server does not list it: check its name", name)
	}
}

// writeClient sends one message to the client. A failed write ends the
// session.
func (s *session) writeClient(msg []byte) {
	s.outMu.Lock()
	defer s.outMu.Unlock()
	if s.outErr != nil {
		return // the client is gone
	}
	buf := make([]byte, 0, len(msg)+1)
	buf = append(append(buf, msg...), '\n')
	if _, err := s.out.Write(buf); err != nil {
		// The client is gone, but the protected calls in flight still run
		// to their end and are recorded: the session ends at EOF, as when
		// the client closes it.
		s.outErr = fmt.Errorf("mcp-proxy: writing to the client: %w", err)
		s.warn("writing to the client failed (%v): answers are dropped until the session ends", err)
	}
}

// warnOnce prints a warning the first time its topic comes up.
func (s *session) warnOnce(topic, format string, args ...any) {
	s.mu.Lock()
	seen := s.warned[topic]
	s.warned[topic] = true
	s.mu.Unlock()
	if !seen {
		s.warn(format, args...)
	}
}

func (s *session) warn(format string, args ...any) {
	fmt.Fprintf(s.stderr, "idem mcp-proxy: "+format+"\n", args...)
}

// fail ends the session with err (the first one wins).
func (s *session) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fatal == nil {
		s.fatal = err
		s.closing = true
		close(s.done)
	}
}

func (s *session) isDone() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// err is the session's fatal error, or nil.
func (s *session) err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fatal
}
