package idemmcp

import (
	"context"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkit/idem/idemcore"
)

// txKey is the context key of a DoTx tool's transaction.
type txKey struct{}

// AddTool registers a typed tool with the server (mcp.AddTool) and its
// policy with m: p, or Options.Tools[t.Name] when p is nil, and read-only if
// t.Annotations has ReadOnlyHint. Through the engine's Do, the handler runs
// once per key; its result, an IsError result included, is stored and
// replayed. Because the handler is registered here, m knows when the SDK
// refused the input before calling it (schema validation, unmarshaling):
// such an answer is not stored. AddTool panics where mcp.AddTool does, and
// for KeyFromArgs on a tool whose name is longer than idemcore.MaxNamespaceLen.
func AddTool[In, Out any](s *mcp.Server, m *Middleware, t *mcp.Tool, h mcp.ToolHandlerFor[In, Out], p *Policy) {
	m.register(t, p, &toolEntry{})
	mcp.AddTool(s, t, func(ctx context.Context, req *mcp.CallToolRequest, in In) (*mcp.CallToolResult, Out, error) {
		markRan(ctx)
		return h(ctx, req, in)
	})
}

// AddRawTool is AddTool for a raw handler (Server.AddTool), which unmarshals
// and validates its arguments itself: every answer it gives, a protocol
// error included, is an outcome and is stored, except those listed in the
// package documentation (idemcore.Retryable, input requests).
func AddRawTool(s *mcp.Server, m *Middleware, t *mcp.Tool, h mcp.ToolHandler, p *Policy) {
	m.register(t, p, &toolEntry{})
	s.AddTool(t, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		markRan(ctx)
		return h(ctx, req)
	})
}

// TxToolHandlerFor is a typed tool handler of the DoTx form: tx is the
// backend's transaction (*idem.Tx for the bbolt engine), which commits with
// the call's record.
type TxToolHandlerFor[In, Out, T any] func(ctx context.Context, req *mcp.CallToolRequest, in In, tx T) (*mcp.CallToolResult, Out, error)

// AddTxTool registers a typed tool of the DoTx form: for tools whose effects
// are local to the engine's store, so that the effect and the record commit
// together and a kill mid-call leaves no extra effect. Each call runs in
// d.DoTx (d is normally the engine m was made with); the handler writes
// through tx only. As DoTx says, the handler MAY RUN MORE THAN ONCE per call
// (with bbolt's journal off, group commit re-runs it when another call in
// the batch fails) and must
// touch nothing but tx: no I/O, no server-to-client requests (elicitation,
// sampling), no shared memory. A tool error (an IsError result or a protocol
// error) rolls its writes back and is stored alone, and replayed.
//
// A DoTx tool always runs in a transaction: under NoKey or RunUnkeyed, a
// call without a key runs under a fresh random key of its own (stored for
// the retention window, deduping nothing). It panics if the tool is
// read-only (it would have no transaction), and where AddTool does.
func AddTxTool[In, Out, T any](s *mcp.Server, m *Middleware, d idemcore.TxDoer[T], t *mcp.Tool, h TxToolHandlerFor[In, Out, T], p *Policy) {
	te := &toolEntry{tx: true, do: func(ctx context.Context, key string, fp []byte, fn func(context.Context) ([]byte, error)) (idemcore.Result, error) {
		return d.DoTx(ctx, key, fp, func(ctx context.Context, tx T) ([]byte, error) {
			return fn(context.WithValue(ctx, txKey{}, tx))
		})
	}}
	m.register(t, p, te)
	if te.policy.ReadOnly {
		panic(fmt.Sprintf("idemmcp: AddTxTool %q: a read-only tool has no transaction (register it with AddTool)", t.Name))
	}
	mcp.AddTool(s, t, func(ctx context.Context, req *mcp.CallToolRequest, in In) (*mcp.CallToolResult, Out, error) {
		markRan(ctx)
		var zero Out
		st := stateFrom(ctx)
		if st == nil || st.tx == nil {
			return nil, zero, fmt.Errorf("idemmcp: tool %q is of the DoTx form: install Middleware.Wrap on the server", t.Name)
		}
		tx, ok := st.tx.(T)
		if !ok {
			return nil, zero, fmt.Errorf("idemmcp: tool %q: the transaction is a %T, not the handler's", t.Name, st.tx)
		}
		return h(ctx, req, in, tx)
	})
}

// markRan tells the middleware that the tool's own handler was called.
func markRan(ctx context.Context) {
	if st := stateFrom(ctx); st != nil {
		st.ran = true
	}
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
