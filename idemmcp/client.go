package idemmcp

import (
	"context"
	"crypto/rand"
	"maps"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

type keyCtx struct{}

// WithKey returns a context whose tools/call requests, sent through a client
// with ClientMiddleware installed, carry key in _meta MetaKey. Set it once
// per logical intent (one model tool call, one step of a plan) and reuse the
// context, or the key, on every retry of that intent: that is what makes the
// retry a replay. A re-plan by the model is a new intent and gets a new key.
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyCtx{}, key)
}

// KeyFrom returns the key WithKey put in ctx.
func KeyFrom(ctx context.Context) (string, bool) {
	k, ok := ctx.Value(keyCtx{}).(string)
	return k, ok
}

// ClientOptions configure ClientMiddleware. A nil *ClientOptions means all
// defaults.
type ClientOptions struct {
	// MintKeys gives a tools/call sent without a key (no WithKey in its
	// context) a fresh random key of its own. This DEDUPES NOTHING ACROSS
	// THE CALLER'S OWN RETRIES: each retry is a new call with a new key, so
	// it runs again. It only lets the call through a server that refuses
	// side-effecting calls without a key. (The go-sdk v1.8.0 client never
	// re-sends a tools/call by itself, so there is no retry below the
	// caller for a minted key to cover.) False by default.
	MintKeys bool
}

// ClientMiddleware returns a sending middleware for a go-sdk client
// (Client.AddSendingMiddleware) that puts the context's key (WithKey) into
// every tools/call's _meta. The caller's params are not modified: the
// request is sent with a copy. A call whose context has no key is sent as it
// is, unless opts.MintKeys. A continuation of a multi-round-trip call, sent
// by the SDK with the first round's params, carries the same key (the server
// derives the continuation's own key from it).
func ClientMiddleware(opts *ClientOptions) mcp.Middleware {
	var o ClientOptions
	if opts != nil {
		o = *opts
	}
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			params, ok := req.GetParams().(*mcp.CallToolParams)
			if method != "tools/call" || !ok || params == nil {
				return next(ctx, method, req)
			}
			key, ok := KeyFrom(ctx)
			if !ok {
				if !o.MintKeys {
					return next(ctx, method, req)
				}
				key = rand.Text()
			}
			p := *params
			p.Meta = maps.Clone(p.Meta)
			if p.Meta == nil {
				p.Meta = mcp.Meta{}
			}
			p.Meta[MetaKey] = key
			// CallTool sends a *ClientRequest[Params]; the SDK's
			// multi-round-trip retries send a *ClientRequest[*CallToolParams].
			switch r := req.(type) {
			case *mcp.ClientRequest[mcp.Params]:
				return next(ctx, method, &mcp.ClientRequest[mcp.Params]{Session: r.Session, Params: &p})
			case *mcp.ClientRequest[*mcp.CallToolParams]:
				return next(ctx, method, &mcp.ClientRequest[*mcp.CallToolParams]{Session: r.Session, Params: &p})
			}
			return next(ctx, method, req)
		}
	}
}

// Replayed reports whether a tool result was answered from the stored
// outcome (its _meta has MetaReplayed true) rather than by running the tool.
func Replayed(res *mcp.CallToolResult) bool {
	if res == nil {
		return false
	}
	v, _ := res.Meta[MetaReplayed].(bool)
	return v
}
