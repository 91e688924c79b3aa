package idemotel_test

import (
	"context"
	"maps"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idemmcp"
)

// metaCarrier reads and writes the W3C trace context in an MCP request's
// _meta, where MCP's semantic conventions carry it (params._meta.traceparent).
type metaCarrier mcp.Meta

func (c metaCarrier) Get(k string) string { s, _ := c[k].(string); return s }
func (c metaCarrier) Set(k, v string)     { c[k] = v }
func (c metaCarrier) Keys() []string      { return nil }

// clientTracing is a sending middleware: a client span per tools/call, its
// trace context put in the request's _meta.
func clientTracing(tp trace.TracerProvider) mcp.Middleware {
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			r, ok := req.(*mcp.ClientRequest[mcp.Params])
			p, isCall := req.GetParams().(*mcp.CallToolParams)
			if method != "tools/call" || !ok || !isCall {
				return next(ctx, method, req)
			}
			ctx, span := tp.Tracer("agent").Start(ctx, "tools/call "+p.Name, trace.WithSpanKind(trace.SpanKindClient))
			defer span.End()
			cp := *p
			cp.Meta = maps.Clone(p.Meta)
			if cp.Meta == nil {
				cp.Meta = mcp.Meta{}
			}
			propagation.TraceContext{}.Inject(ctx, metaCarrier(cp.Meta))
			return next(ctx, method, &mcp.ClientRequest[mcp.Params]{Session: r.Session, Params: &cp})
		}
	}
}

// serverTracing is a receiving middleware: a server span per tools/call, a
// child of the trace context in its _meta.
func serverTracing(tp trace.TracerProvider) mcp.Middleware {
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			r, ok := req.(*mcp.CallToolRequest)
			if method != "tools/call" || !ok || r.Params == nil {
				return next(ctx, method, req)
			}
			ctx = propagation.TraceContext{}.Extract(ctx, metaCarrier(r.Params.Meta))
			ctx, span := tp.Tracer("shop").Start(ctx, "tools/call "+r.Params.Name, trace.WithSpanKind(trace.SpanKindServer))
			defer span.End()
			return next(ctx, method, req)
		}
	}
}

// An MCP tool call through the real go-sdk client and server: the agent's
// span, the server's tools/call span, idem.do under it, idem.fn, and the
// tool's own span; the agent's retry with the same key is a replay.
func TestMCPToolCallSpanNesting(t *testing.T) {
	each(t, func(t *testing.T, b backend) {
		o := &idemcore.Options{}
		tel, eng := b.start(t, o)
		orders := 0
		server := mcp.NewServer(&mcp.Implementation{Name: "shop", Version: "v1"}, nil)
		m := idemmcp.New(eng.doer, nil)
		idemmcp.AddTool(server, m, &mcp.Tool{Name: "create_order"},
			func(ctx context.Context, _ *mcp.CallToolRequest, in struct {
				SKU string `json:"sku"`
			}) (*mcp.CallToolResult, map[string]string, error) {
				_, span := tel.tp.Tracer("shop").Start(ctx, "insert order")
				orders++
				span.End()
				return nil, map[string]string{"order_id": "ord_1"}, nil
			}, nil)
		server.AddReceivingMiddleware(serverTracing(tel.tp), m.Wrap) // the first is the outermost

		ctx := context.Background()
		st, ct := mcp.NewInMemoryTransports()
		ss, err := server.Connect(ctx, st, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer ss.Close()
		client := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil)
		client.AddSendingMiddleware(clientTracing(tel.tp), idemmcp.ClientMiddleware(nil))
		cs, err := client.Connect(ctx, ct, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		intent := idemmcp.WithKey(ctx, "call_7f3a")
		for i := range 2 {
			res, err := cs.CallTool(intent, &mcp.CallToolParams{Name: "create_order", Arguments: map[string]any{"sku": "A1"}})
			if err != nil || res.IsError {
				t.Fatalf("call %d: %+v, %v", i, res, err)
			}
			if idemmcp.Replayed(res) != (i == 1) {
				t.Fatalf("call %d: replayed %v", i, idemmcp.Replayed(res))
			}
		}
		if orders != 1 {
			t.Fatalf("the tool ran %d times, want 1", orders)
		}
		assertNesting(t, tel, "insert order")
	})
}
