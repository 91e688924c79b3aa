package idemmcp

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkit/idem/idemcore"
)

// The _meta entries the middleware reads and writes. The prefix is the
// reverse-DNS of the project's home (github.com/idemkit), as the MCP
// specification asks of _meta prefixes.
const (
	// MetaKey is the request _meta entry that carries the idempotency key:
	// a JSON string of 1 to 255 bytes of UTF-8, without white space at
	// either end or control or format characters (idemcore.ValidateKey). The key is read from there only (go-sdk drops unknown
	// fields of params), never from the JSON-RPC id, which differs between
	// a request and its retry.
	MetaKey = "io.github.idemkit/idempotency-key"
	// MetaReplayed is the result _meta entry, true, on a result answered
	// from the stored outcome rather than by running the tool.
	MetaReplayed = "io.github.idemkit/replayed"
	// MetaRecovered is the request _meta entry, true, by which a proxy in
	// front of a server tells it that the call recovers an interrupted
	// execution, so a key-aware server can reconcile. The middleware does
	// not read it: behind the middleware, a tool reads
	// idemcore.CallFrom(ctx).Recovered.
	MetaRecovered = "io.github.idemkit/recovered"
)

// Defaults for the zero values of Options.
const (
	// DefaultMaxWait bounds how long a duplicate waits for the running
	// call with its key (InProgressWait) before it is refused as in
	// progress.
	DefaultMaxWait = 30 * time.Second
	// DefaultRetryAfter is the retryAfter a refusal suggests.
	DefaultRetryAfter = time.Second
)

// Options configure New. A nil *Options means all defaults.
type Options struct {
	// Tools holds the policy of tools registered with the SDK directly
	// (mcp.AddTool or Server.AddTool); tools registered with this package's
	// AddTool, AddRawTool or AddTxTool carry their own. A tool in neither
	// has the zero Policy (key from _meta, refused without), unless the
	// server's tools/list (asked through the handlers below the middleware
	// on each call of such a tool) shows it annotated read-only
	// (ReadOnlyHint): then it passes through. A call of a tool the server
	// does not have passes through too, for the SDK to answer.
	Tools map[string]Policy
	// Scope, if set, returns the key space of a call: the authenticated
	// principal (from req.Extra.TokenInfo on an authenticated HTTP
	// transport; stdio and in-memory transports have none). The stored key
	// is then idemcore.KeyOf("idemmcp", scope, key), so that two principals
	// sending one key never meet and neither learns the other's key exists.
	// An error refuses the call with it and stores nothing.
	Scope func(ctx context.Context, req *mcp.CallToolRequest) (string, error)
	// InProgress is the policy for duplicates of a running call. Zero is
	// InProgressWait.
	InProgress InProgressPolicy
	// MaxWait bounds a duplicate's wait under InProgressWait, wall-clock.
	// Zero means DefaultMaxWait.
	MaxWait time.Duration
	// RetryAfter is the wait refusals suggest. Zero means DefaultRetryAfter.
	RetryAfter time.Duration
	// Logger receives a tool's panic (value and stack, at error level) and,
	// at warn level, a Do tool that ran but whose outcome the store failed
	// to record; keys and arguments are never logged. Nil discards.
	Logger *slog.Logger
}

// Middleware dedupes tools/call requests of a go-sdk server through an idem
// engine. Install it once per server, when the server is built:
//
//	m := idemmcp.New(engine, nil)
//	idemmcp.AddTool(server, m, &mcp.Tool{Name: "create_order"}, createOrder, nil)
//	server.AddReceivingMiddleware(m.Wrap)
//
// (AddReceivingMiddleware called per request stacks it, go-sdk issue 174;
// a Middleware wrapped around itself passes the inner calls through.)
//
// For each call of a side-effecting tool, the middleware takes the key (by
// the tool's Policy), computes the Fingerprint, and runs the rest of the
// server's handling of the call once per key through the engine; every later
// call with the key gets the stored outcome back, with MetaReplayed in its
// result's _meta. See the package documentation for what is stored and what
// is refused.
type Middleware struct {
	d    idemcore.Doer
	opts Options

	mu      sync.Mutex
	tools   map[string]*toolEntry
	flights map[string]*flight
}

// toolEntry is what the middleware knows of a tool.
type toolEntry struct {
	policy Policy
	// tracked: the handler was registered through this package, so the
	// middleware learns whether it ran (else the SDK refused the input).
	tracked bool
	// do runs fn under the key: the engine's Do, or DoTx for a DoTx tool.
	do func(ctx context.Context, key string, fp []byte, fn func(context.Context) ([]byte, error)) (idemcore.Result, error)
	tx bool
}

// flight is a call running in this middleware, for its duplicates.
type flight struct {
	fp   string
	done chan struct{}
}

// New returns a Middleware over d: any idem engine (idem.Engine, or another
// backend's). Tools of the DoTx form are registered with AddTxTool.
func New(d idemcore.Doer, opts *Options) *Middleware {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.MaxWait <= 0 {
		o.MaxWait = DefaultMaxWait
	}
	if o.RetryAfter <= 0 {
		o.RetryAfter = DefaultRetryAfter
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &Middleware{d: d, opts: o, tools: map[string]*toolEntry{}, flights: map[string]*flight{}}
}

// stateKey is the context key of the call the middleware runs.
type stateKey struct{}

// callState travels in the context of the handling the middleware runs.
type callState struct {
	m   *Middleware
	ran bool // the tool's own handler was called
	tx  any  // the DoTx tool form's transaction
}

func stateFrom(ctx context.Context) *callState {
	s, _ := ctx.Value(stateKey{}).(*callState)
	return s
}

// Wrap is the receiving middleware (an mcp.Middleware): pass it to
// Server.AddReceivingMiddleware. Methods other than tools/call pass through.
func (m *Middleware) Wrap(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		r, ok := req.(*mcp.CallToolRequest)
		if method != "tools/call" || !ok || r.Params == nil {
			return next(ctx, method, req)
		}
		if s := stateFrom(ctx); s != nil && s.m == m {
			return next(ctx, method, req) // stacked: the outer one dedupes
		}
		return m.call(ctx, method, r, next)
	}
}

// lookup returns what the middleware knows of a tool; known is false for
// a tool registered with the SDK directly and absent from Options.Tools.
func (m *Middleware) lookup(name string) (t *toolEntry, known bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if t, ok := m.tools[name]; ok {
		return t, true
	}
	p, ok := m.opts.Tools[name]
	return &toolEntry{policy: p, do: m.d.Do}, ok
}

// listed returns the server's definition of the named tool, as its
// tools/list answers (asked through the handlers below the middleware), or
// nil if the server has no such tool.
func listed(ctx context.Context, r *mcp.CallToolRequest, next mcp.MethodHandler) (*mcp.Tool, error) {
	params := &mcp.ListToolsParams{}
	for {
		res, err := next(ctx, "tools/list", &mcp.ListToolsRequest{Session: r.Session, Params: params, Extra: r.Extra})
		if err != nil {
			return nil, err
		}
		lr, ok := res.(*mcp.ListToolsResult)
		if !ok {
			return nil, fmt.Errorf("idemmcp: tools/list answered a %T", res)
		}
		for _, t := range lr.Tools {
			if t.Name == r.Params.Name {
				return t, nil
			}
		}
		if lr.NextCursor == "" || lr.NextCursor == params.Cursor {
			return nil, nil
		}
		params = &mcp.ListToolsParams{Cursor: lr.NextCursor}
	}
}

// register records a tool registered through this package.
func (m *Middleware) register(t *mcp.Tool, p *Policy, te *toolEntry) {
	if p != nil {
		te.policy = *p
	} else if op, ok := m.opts.Tools[t.Name]; ok {
		te.policy = op
	}
	if t.Annotations != nil && t.Annotations.ReadOnlyHint {
		te.policy.ReadOnly = true
	}
	if te.policy.Key.kind == keyArgs && (len(t.Name) == 0 || len(t.Name) > idemcore.MaxNamespaceLen) {
		panic(fmt.Sprintf("idemmcp: tool %q: KeyFromArgs needs a name of 1 to %d bytes", t.Name, idemcore.MaxNamespaceLen))
	}
	te.tracked = true
	if te.do == nil {
		te.do = m.d.Do
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.tools[t.Name] = te
}

// passThrough runs the handling unprotected, still telling a tracked
// handler that it runs under the middleware.
func (m *Middleware) passThrough(ctx context.Context, method string, r *mcp.CallToolRequest, next mcp.MethodHandler) (mcp.Result, error) {
	return next(context.WithValue(ctx, stateKey{}, &callState{m: m}), method, r)
}

func (m *Middleware) call(ctx context.Context, method string, r *mcp.CallToolRequest, next mcp.MethodHandler) (res mcp.Result, err error) {
	t, known := m.lookup(r.Params.Name)
	if !known {
		// Registered with the SDK directly: its annotations say whether
		// it is read-only, and an unknown tool is the SDK's to answer.
		def, err := listed(ctx, r, next)
		if err != nil {
			return nil, err
		}
		if def == nil || (def.Annotations != nil && def.Annotations.ReadOnlyHint) {
			return m.passThrough(ctx, method, r, next)
		}
	}
	if t.policy.ReadOnly || (t.policy.Key.kind == keyNone && !t.tx) {
		return m.passThrough(ctx, method, r, next)
	}
	key, err := m.key(t, r)
	if err != nil {
		return nil, err
	}
	if key == "" {
		if !t.policy.RunUnkeyed && t.policy.Key.kind != keyNone {
			return nil, refuse(TypeKeyRequired, 0,
				"tool %q has side effects: send an idempotency key in _meta %q", r.Params.Name, MetaKey)
		}
		if !t.tx {
			return m.passThrough(ctx, method, r, next)
		}
		key = "idemmcp-unkeyed:" + rand.Text() // a DoTx tool needs a transaction
	}
	fp, err := Fingerprint(&mcp.CallToolParamsRaw{Name: r.Params.Name, Arguments: r.Params.Arguments,
		InputResponses: r.Params.InputResponses, RequestState: r.Params.RequestState})
	if err != nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: err.Error()}
	}
	if len(r.Params.InputResponses) > 0 || r.Params.RequestState != "" {
		// A continuation is a call of its own: its round may perform the
		// effect, and it must not meet the first round's key.
		key = idemcore.KeyOf("idemmcp-continuation", key, r.Params.RequestState)
	}
	if m.opts.Scope != nil {
		scope, err := m.opts.Scope(ctx, r)
		if err != nil {
			return nil, err
		}
		key = idemcore.KeyOf("idemmcp", scope, key)
	}

	release, err := m.enter(ctx, key, string(fp))
	if err != nil {
		return nil, err
	}
	defer release()
	defer func() {
		if v := recover(); v != nil {
			m.opts.Logger.Error("idemmcp: tool panicked", "tool", r.Params.Name, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			res, err = nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: fmt.Sprintf("tool %q panicked", r.Params.Name)}
		}
	}()
	return m.run(ctx, method, r, next, t, key, fp)
}

// enter takes the key in this middleware, or waits for (or refuses because
// of) the running call with it. A call with another fingerprint goes on: the
// engine refuses it as a conflict.
func (m *Middleware) enter(ctx context.Context, key, fp string) (release func(), err error) {
	var deadline <-chan time.Time
	for {
		m.mu.Lock()
		f := m.flights[key]
		if f == nil {
			f = &flight{fp: fp, done: make(chan struct{})}
			m.flights[key] = f
			m.mu.Unlock()
			return func() {
				m.mu.Lock()
				delete(m.flights, key)
				m.mu.Unlock()
				close(f.done)
			}, nil
		}
		m.mu.Unlock()
		if f.fp != fp {
			return func() {}, nil
		}
		if m.opts.InProgress == InProgressRefuse {
			return nil, m.inProgress(m.opts.RetryAfter)
		}
		if waitHook != nil {
			waitHook()
		}
		if deadline == nil {
			timer := time.NewTimer(m.opts.MaxWait)
			defer timer.Stop()
			deadline = timer.C
		}
		select {
		case <-f.done:
		case <-deadline:
			return nil, m.inProgress(m.opts.RetryAfter)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// waitHook, if set (by tests), runs when a duplicate starts waiting.
var waitHook func()

func (m *Middleware) inProgress(after time.Duration) error {
	return refuse(TypeInProgress, after, "the first call with this key is still running")
}

// key returns the call's idempotency key by the tool's policy: "" when it
// has none.
func (m *Middleware) key(t *toolEntry, r *mcp.CallToolRequest) (string, error) {
	switch t.policy.Key.kind {
	case keyNone:
		return "", nil
	case keyArgs:
		var args map[string]json.RawMessage
		if len(r.Params.Arguments) > 0 {
			if err := json.Unmarshal(r.Params.Arguments, &args); err != nil {
				return "", &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("%v: %v", ErrInvalidArguments, err)}
			}
		}
		parts := []string{r.Params.Name}
		for _, name := range t.policy.Key.args {
			v, ok := args[name]
			if !ok || string(v) == "null" {
				return "", nil
			}
			var b bytes.Buffer
			if err := canonical(&b, v); err != nil {
				return "", &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("%v: %v", ErrInvalidArguments, err)}
			}
			parts = append(parts, b.String())
		}
		return idemcore.KeyOf(parts...), nil
	}
	v, ok := r.Params.Meta[MetaKey]
	if !ok || v == nil {
		return "", nil
	}
	key, ok := v.(string)
	if !ok {
		return "", refuse(TypeKeyInvalid, 0, "_meta %q must be a string", MetaKey)
	}
	if why := badKey(key); why != "" {
		return "", refuse(TypeKeyInvalid, 0, "invalid key: %s", why)
	}
	return key, nil
}

// badKey says what is wrong with a key, by DESIGN.md's rule 1 (Stripe's
// 255-byte limit): "" if nothing.
func badKey(key string) string {
	switch {
	case strings.TrimSpace(key) == "":
		return "empty or blank"
	case len(key) > idemcore.MaxKeyLen:
		return fmt.Sprintf("%d bytes, the limit is %d", len(key), idemcore.MaxKeyLen)
	case !utf8.ValidString(key):
		return "not valid UTF-8"
	case strings.ContainsFunc(key, unicode.IsControl):
		return "holds control characters"
	}
	// The engine's rules (white space at an end, format characters), also
	// when the stored key is a hash (Scope, a continuation), which the
	// engine cannot check.
	if err := idemcore.ValidateKey(key); err != nil {
		return strings.TrimPrefix(err.Error(), idemcore.ErrInvalidKey.Error()+": ")
	}
	return ""
}

// Outcomes that are stored as errors, so that a DoTx tool's writes roll
// back; their Message is the serialized outcome.
const (
	codeToolError     = "mcp_tool_error"
	codeProtocolError = "mcp_protocol_error"
)

var (
	errNotRun   = errors.New("idemmcp: the tool's handler did not run (its input was refused)")
	errNotFinal = errors.New("idemmcp: the result asks for input: not final")
)

// run runs the handling through the engine and turns the outcome into the
// answer.
func (m *Middleware) run(ctx context.Context, method string, r *mcp.CallToolRequest, next mcp.MethodHandler,
	t *toolEntry, key string, fp []byte) (mcp.Result, error) {
	// The answer of a handling whose outcome is not stored, from this
	// call's own execution.
	var (
		own    bool
		ownRes mcp.Result
		ownErr error
		// ran, ranRes, ranErr: the answer of this call's own handling, for
		// an outcome too large to record (the engine's MaxResponseSize) or
		// one the store failed to record after a Do tool ran.
		ran    bool
		ranRes mcp.Result
		ranErr error
	)
	body := func(ctx context.Context) ([]byte, error) {
		own, ownRes, ownErr = false, nil, nil // fn of DoTx may run again
		st := &callState{m: m, tx: ctx.Value(txKey{})}
		res, err := next(context.WithValue(ctx, stateKey{}, st), method, r)
		ran, ranRes, ranErr = true, res, err
		keep := func(why error) ([]byte, error) {
			own, ownRes, ownErr = true, res, err
			return nil, idemcore.Retryable(why)
		}
		if t.tracked && !st.ran {
			return keep(errNotRun)
		}
		if err != nil {
			if errors.Is(err, idemcore.ErrRetryable) {
				return keep(err)
			}
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				own, ownRes, ownErr = true, nil, err
				return nil, err
			}
			return nil, idemcore.WithCode(errors.New(string(encodeWireError(err))), codeProtocolError)
		}
		ctr, ok := res.(*mcp.CallToolResult)
		if !ok || ctr == nil {
			return keep(fmt.Errorf("idemmcp: unexpected result %T", res))
		}
		switch {
		case ctr.InputRequests != nil:
			return keep(errNotFinal)
		case errors.Is(ctr.GetError(), idemcore.ErrRetryable):
			return keep(ctr.GetError())
		case !t.tracked && ctr.IsError && ctr.GetError() != nil &&
			strings.HasPrefix(ctr.GetError().Error(), `validating "arguments": `):
			return keep(errNotRun) // the SDK's schema check, before the handler
		}
		b, err := encodeResult(ctr)
		if err != nil {
			return keep(err)
		}
		if ctr.IsError {
			return nil, idemcore.WithCode(errors.New(string(b)), codeToolError)
		}
		return b, nil
	}
	res, err := t.do(ctx, key, fp, body)
	if own {
		return ownRes, ownErr // not stored: this execution's own answer
	}
	if ran && errors.Is(err, idemcore.ErrResponseTooLarge) {
		// The tool ran and answered, but the answer is over the engine's
		// limit: its caller gets it; retries get the stored error.
		return ranRes, ranErr
	}
	var ie *idemcore.Error
	switch {
	case err == nil:
		return answer(res.Response, false, res.Replayed)
	case errors.As(err, &ie) && (ie.Code == codeToolError || ie.Code == codeProtocolError):
		return answer([]byte(ie.Message), ie.Code == codeProtocolError, res.Replayed || ie.Replayed)
	}
	ref, refused := idemcore.RefusalOf(err)
	switch {
	case refused && ref.Kind != idemcore.RefusalUnavailable:
		return nil, RefusalFor(ref, m.opts.RetryAfter, err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return nil, err
	case errors.As(err, &ie):
		// A stored error of another writer's (an operator's resolution).
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: ie.Error()}
	}
	if ran && !t.tx {
		// A Do tool ran and did its effect, but the store failed to record
		// its outcome: its caller gets its answer (as idemhttp answers with
		// the handler's response); the key stays started, for the recovery
		// policy. A DoTx tool's writes rolled back with the failed commit.
		cause := err
		if oe, ok := errors.AsType[*idemcore.OpError](err); ok && oe.Err != nil {
			cause = oe.Err // no key in logs
		}
		m.opts.Logger.Warn("idemmcp: the tool ran but its outcome was not recorded", "tool", r.Params.Name, "err", cause)
		return ranRes, ranErr
	}
	return nil, RefusalFor(idemcore.RefusalUnavailable.Refusal(), m.opts.RetryAfter, err)
}
