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
//     (MetaKey), a string, or a natural key over chosen arguments
//     (Tool.KeyArgs). The JSON-RPC id is never the key: a retry has a new id.
//   - The fingerprint is the tool's name and its arguments as parsed JSON
//     (Canonical: key order ignored, numbers compared as decimals), plus
//     inputResponses and requestState for a continuation; never _meta.
//   - The first call is sent to the server under an id of the proxy's own
//     ("io.github.idemkit/mcp-proxy:N"; clients must not use ids with that
//     prefix), with MetaKey, MetaRecovered and MetaAttempt set in its _meta,
//     so that a key-aware server can reconcile a recovered call. The server's
//     answer (a result, an isError result or a JSON-RPC error) is recorded and
//     sent to the client under the client's id.
//   - A retry with the key is answered from the record under the NEW request's
//     id, with MetaReplayed true in the result's _meta; the server sees nothing.
//     Another call with the same key waits for the first (or is refused with
//     CodeInProgress, by the engine's InFlightPolicy); other arguments with
//     the key are refused with CodeConflict.
//   - Not recorded: JSON-RPC errors that say the server refused the request
//     before running it (parse error, invalid request, method not found,
//     invalid params: -32700, -32600, -32601, -32602), a result that is not
//     final (resultType input_required, non-empty inputRequests, or a task), and a result whose _meta has
//     MetaRetryable true (a key-aware server's transient failure). They are
//     answered and the key stays free.
//   - A cancellation (notifications/cancelled) of a protected call is never
//     forwarded, neither the first caller's nor a waiter's: the call runs to
//     its end so its outcome is recorded, and a retry replays it instead of
//     meeting an unknown outcome. The cancelled request gets no response
//     (the receiver of a cancellation should not answer it).
//
// Calls of tools not in the configuration are relayed unprotected, with a
// warning on stderr the first time each one is called, unless the server's
// tools/list marked it read-only (annotations.readOnlyHint). Task-augmented
// calls (params.task) are relayed unprotected with a warning.
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
// reconcile with the key. After MaxRounds server deaths in one call the client
// gets CodeServerDied and the record stays interrupted. A relayed request
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
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
)

// The _meta names the proxy reads and writes: reverse-DNS of the project's
// home, as the MCP specification asks of _meta prefixes.
const (
	// MetaKey is the idempotency key in a tools/call's params._meta: a JSON
	// string of 1 to idem.MaxKeyLen bytes. The proxy sets it, on the request
	// it sends to the server, to the key it used (a natural key too).
	MetaKey = "io.github.idemkit/idempotency-key"
	// MetaRecovered, a boolean in the _meta of the request sent to the server,
	// is true when the call re-executes an interrupted one (a server killed
	// mid-call): its effect may have happened, reconcile by MetaKey.
	MetaRecovered = "io.github.idemkit/recovered"
	// MetaAttempt, a number in the same _meta, is the execution's attempt,
	// from 1.
	MetaAttempt = "io.github.idemkit/attempt"
	// MetaReplayed is true in the _meta of a result answered from the record.
	MetaReplayed = "io.github.idemkit/replayed"
	// MetaRetryable, true in the _meta of a server's result, marks a transient
	// failure whose effect did not happen: the result is not recorded.
	MetaRetryable = "io.github.idemkit/retryable"
)

// JSON-RPC error codes of the proxy's refusals, in the range JSON-RPC leaves
// to implementations (-32000 to -32099). Each error's data is an object with
// "type" (the name after the code below; the first two are SEP-3182's) and,
// for CodeInProgress, "retryAfter" in seconds.
const (
	// CodeInProgress: idempotency_key_in_progress, the first call with the
	// key still runs (the engine's InFlightFail). Retry after retryAfter.
	CodeInProgress = -32011
	// CodeConflict: idempotency_key_conflict, the key was used with another
	// tool or other arguments. Nothing ran.
	CodeConflict = -32012
	// CodeKeyRequired: idempotency_key_required, a protected tool was called
	// without a key (Config.MissingKey "refuse"), or with one that is not a
	// valid key. Nothing ran.
	CodeKeyRequired = -32013
	// CodeIncomplete: idempotency_key_incomplete, an interrupted execution
	// the engine refuses to re-execute (RecoverRefuse) until an operator
	// resolves the key (`idem resolve`, `idem forget`).
	CodeIncomplete = -32014
	// CodeServerDied: server_died, the server process died during the call.
	// For a protected call the record stays interrupted (a retry with the key
	// re-executes it, recovered); a relayed request was not retried.
	CodeServerDied = -32015
	// CodeStore: store_failed, the idem store failed (the file, a full disk):
	// the call's outcome could not be recorded or read.
	CodeStore = -32016
)

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
//     was initialized (see the package documentation), or when writing to
//     out fails.
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
		internal: map[string]chan []byte{}, readOnly: map[string]bool{}, warned: map[string]bool{},
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

	outMu sync.Mutex
	out   io.Writer

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
		Name           string                     `json:"name"`
		Arguments      json.RawMessage            `json:"arguments"`
		Meta           map[string]json.RawMessage `json:"_meta"`
		Task           json.RawMessage            `json:"task"`
		InputResponses json.RawMessage            `json:"inputResponses"`
		RequestState   json.RawMessage            `json:"requestState"`
	}
	if json.Unmarshal(h.Params, &params) != nil {
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
		s.writeClient(errorResponse(h.ID, CodeKeyRequired, "idempotency_key_required", err.Error(), nil))
		return
	}
	if key == "" {
		if s.cfg.MissingKey != MissingKeyRun {
			s.writeClient(errorResponse(h.ID, CodeKeyRequired, "idempotency_key_required",
				fmt.Sprintf("tool %q has side effects: send an idempotency key in params._meta[%q]", params.Name, MetaKey), nil))
			return
		}
		s.warnOnce("nokey:"+params.Name, "calls of %q without an idempotency key run unprotected", params.Name)
		s.relay(msg, h.ID, h.Method)
		return
	}
	fp, err := fingerprint(params.Name, params.Arguments, params.InputResponses, params.RequestState)
	if err != nil {
		s.writeClient(errorResponse(h.ID, -32602, "", "invalid params: "+err.Error(), nil))
		return
	}
	pc := &protectedCall{}
	s.mu.Lock()
	s.protected[idKey(h.ID)] = pc
	s.mu.Unlock()
	s.calls.Add(1)
	go s.runProtected(msg, bytes.Clone(h.ID), key, fp, pc)
}

// keyOf returns the call's idempotency key: natural (Tool.KeyArgs) or from
// _meta; "" if _meta has none.
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
			if v == nil {
				v = json.RawMessage("null")
			}
			c, err := Canonical(v)
			if err != nil {
				return "", fmt.Errorf("argument %q of %q: %w", a, name, err)
			}
			parts = append(parts, string(c))
		}
		return idem.KeyOf(parts...), nil
	}
	raw, ok := meta[MetaKey]
	if !ok || isNull(raw) {
		return "", nil
	}
	var key string
	if err := json.Unmarshal(raw, &key); err != nil {
		return "", fmt.Errorf("params._meta[%q] must be a string", MetaKey)
	}
	if strings.TrimSpace(key) == "" {
		return "", fmt.Errorf("params._meta[%q] is blank", MetaKey)
	}
	return key, nil
}

// fingerprint is the canonical JSON of the call's name, arguments (absent and
// null count as {}), and a continuation's inputResponses and requestState.
func fingerprint(name string, args, inputResponses, requestState json.RawMessage) ([]byte, error) {
	if isNull(args) {
		args = json.RawMessage("{}")
	}
	o := object{{key: "name", raw: jsonString(name)}, {key: "arguments", raw: args}}
	if !isNull(inputResponses) {
		o = append(o, member{key: "inputResponses", raw: inputResponses})
	}
	if !isNull(requestState) {
		o = append(o, member{key: "requestState", raw: requestState})
	}
	return Canonical(o.bytes())
}

// runProtected runs one protected call through the engine and answers the
// client.
func (s *session) runProtected(msg, id json.RawMessage, key string, fp []byte, pc *protectedCall) {
	defer s.calls.Done()
	defer func() {
		s.mu.Lock()
		delete(s.protected, idKey(id))
		s.mu.Unlock()
	}()
	var answer []byte
	for round := 1; ; round++ {
		c := s.liveChild(nil)
		if c == nil {
			return // the session failed: nobody to answer
		}
		res, err := s.p.Engine.Do(c.ctx, key, fp, func(ctx context.Context) ([]byte, error) {
			return s.execute(ctx, c, msg, key)
		})
		var inProgress *idem.InProgressError
		switch {
		case err == nil:
			answer, err = reply(res.Response, id, res.Replayed)
		case errors.Is(err, idem.ErrRetryable) && res.Response != nil:
			answer, err = reply(res.Response, id, false)
		case c.ctx.Err() != nil && !s.isDone() && round < MaxRounds:
			continue // the server died: run it again on the next one
		case c.ctx.Err() != nil:
			answer = errorResponse(id, CodeServerDied, "server_died",
				fmt.Sprintf("the server process died during the call %d times: its outcome is unknown; a retry with the same key re-executes it", round), nil)
		case errors.Is(err, idem.ErrFingerprintMismatch):
			answer = errorResponse(id, CodeConflict, "idempotency_key_conflict",
				"the idempotency key was used with another tool or other arguments", nil)
		case errors.As(err, &inProgress):
			secs := int64((inProgress.RetryAfter + time.Second - 1) / time.Second)
			answer = errorResponse(id, CodeInProgress, "idempotency_key_in_progress",
				"a call with this idempotency key is in progress", map[string]any{"retryAfter": secs})
		case errors.Is(err, idem.ErrIncomplete):
			answer = errorResponse(id, CodeIncomplete, "idempotency_key_incomplete",
				"an earlier call with this idempotency key was interrupted and its outcome is unknown: an operator must resolve the key", nil)
		case errors.Is(err, idem.ErrInvalidKey):
			answer = errorResponse(id, CodeKeyRequired, "idempotency_key_required", err.Error(), nil)
		case errors.Is(err, idem.ErrResponseTooLarge):
			answer = errorResponse(id, CodeStore, "store_failed", err.Error(), nil)
		default:
			answer = errorResponse(id, CodeStore, "store_failed", "the call's outcome could not be recorded or read: "+err.Error(), nil)
		}
		if err != nil && answer == nil {
			answer = errorResponse(id, CodeStore, "store_failed", "the recorded answer does not decode: "+err.Error(), nil)
		}
		break
	}
	if !pc.cancelled.Load() {
		s.writeClient(answer)
	}
}

// execute is the fn of a protected call: it sends the call to server c under
// an id of the proxy's own, with the key, the attempt and the recovered flag
// in _meta, and returns the server's answer, or ctx's error if c dies first.
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
	select {
	case resp := <-ch:
		return resp, verdict(resp)
	case <-ctx.Done():
		return nil, ctx.Err()
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
	return nil
}

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
func errorResponse(id json.RawMessage, code int, typ, message string, extra map[string]any) []byte {
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

// noteTools remembers which tools a tools/list result marks read-only.
// Called with s.mu held.
func (s *session) noteTools(result json.RawMessage) {
	var r struct {
		Tools []struct {
			Name        string `json:"name"`
			Annotations struct {
				ReadOnlyHint bool `json:"readOnlyHint"`
			} `json:"annotations"`
		} `json:"tools"`
	}
	if json.Unmarshal(result, &r) != nil {
		return
	}
	for _, t := range r.Tools {
		s.readOnly[t.Name] = t.Annotations.ReadOnlyHint
	}
}

// writeClient sends one message to the client. A failed write ends the
// session.
func (s *session) writeClient(msg []byte) {
	s.outMu.Lock()
	defer s.outMu.Unlock()
	buf := make([]byte, 0, len(msg)+1)
	buf = append(append(buf, msg...), '\n')
	if _, err := s.out.Write(buf); err != nil {
		s.fail(fmt.Errorf("mcp-proxy: writing to the client: %w", err))
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
