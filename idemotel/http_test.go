package idemotel_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/idemotel"
)

// wantChild fails unless child's parent is parent, in parent's trace.
func wantChild(t *testing.T, parent, child sdktrace.ReadOnlySpan) {
	t.Helper()
	if child.Parent().SpanID() != parent.SpanContext().SpanID() || child.SpanContext().TraceID() != parent.SpanContext().TraceID() {
		t.Errorf("%s's parent is %v in trace %v, want %s %v in trace %v", child.Name(), child.Parent().SpanID(), child.SpanContext().TraceID(),
			parent.Name(), parent.SpanContext().SpanID(), parent.SpanContext().TraceID())
	}
}

// A service with otelhttp and idemhttp: the client's span, otelhttp's server
// span, idem.do under it, idem.fn under that, the handler's own span under
// fn; the retry's idem.do is a replay with no fn under it.
func TestHTTPServerSpanNesting(t *testing.T) {
	each(t, func(t *testing.T, b backend) {
		o := &idemcore.Options{}
		tel := newTelemetry(t, o, nil)
		eng := b.open(t, o)
		created := 0
		mux := http.NewServeMux()
		mux.HandleFunc("POST /v1/orders", func(w http.ResponseWriter, r *http.Request) {
			_, span := tel.tp.Tracer("shop").Start(r.Context(), "insert order")
			created++
			span.End()
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, "order %d", created)
		})
		prop := otelhttp.WithPropagators(propagation.TraceContext{})
		srv := httptest.NewServer(otelhttp.NewHandler(idemhttp.Middleware(eng.doer, nil)(mux), "POST /v1/orders",
			otelhttp.WithTracerProvider(tel.tp), prop))
		defer srv.Close()
		client := &http.Client{Transport: otelhttp.NewTransport(http.DefaultTransport, otelhttp.WithTracerProvider(tel.tp), prop)}
		for range 2 {
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/orders", strings.NewReader(`{"sku":"book"}`))
			req.Header.Set("Idempotency-Key", `"`+"order-1"+`"`)
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated || string(body) != "order 1" {
				t.Fatalf("answer %d %q, want 201 order 1", resp.StatusCode, body)
			}
		}
		srv.Close() // the server's spans end with their requests
		var servers, clients []sdktrace.ReadOnlySpan
		for _, s := range tel.spans.Ended() {
			switch s.SpanKind() {
			case trace.SpanKindServer:
				servers = append(servers, s)
			case trace.SpanKindClient:
				clients = append(clients, s)
			}
		}
		if len(servers) != 2 || len(clients) != 2 {
			t.Fatalf("%d server and %d client spans, want 2 each (all: %v)", len(servers), len(clients), names(tel.spans.Ended()))
		}
		calls := tel.ended("idem.do")
		if len(calls) != 2 {
			t.Fatalf("%d idem.do spans, want 2", len(calls))
		}
		for i := range 2 {
			wantChild(t, clients[i], servers[i])
			wantChild(t, servers[i], calls[i])
		}
		wantAttr(t, calls[0], idemotel.AttrOutcome, "executed")
		wantAttr(t, calls[1], idemotel.AttrOutcome, "replayed")
		fn := tel.one(t, "idem.fn")
		wantChild(t, calls[0], fn)
		wantChild(t, fn, tel.one(t, "insert order"))
	})
}
