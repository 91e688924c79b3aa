package idemmcp

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkit/idem/idemcore"
)

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
