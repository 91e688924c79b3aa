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

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idemhttp"
)

// A service with otelhttp and idemhttp: the client's span, otelhttp's server
// span, idem.do under it, idem.fn under that, the handler's own span under
// fn; the retry's idem.do is a replay with no fn under it.
func TestHTTPServerSpanNesting(t *testing.T) {
	each(t, func(t *testing.T, b backend) {
		o := &idemcore.Options{}
		tel, eng := b.start(t, o)
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
		assertNesting(t, tel, "insert order")
	})
}
