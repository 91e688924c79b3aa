package idemotel_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/idemotel"
)

// A service with otelhttp and idemhttp: each request's trace shows idem.do
// under otelhttp's server span, with its outcome; the retry is a replay, and
// fn (the handler) runs once, under idem.fn.
func Example() {
	spans := tracetest.NewSpanRecorder() // in a service: an OTLP exporter
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	tel, err := idemotel.New(&idemotel.Options{TracerProvider: tp}) // nil: the global providers
	if err != nil {
		log.Fatal(err)
	}
	opts := &idem.Options{}
	tel.Install(opts) // opts.Tracer and opts.Observer

	dir, _ := os.MkdirTemp("", "idemotel")
	defer os.RemoveAll(dir)
	engine, err := idem.Open(filepath.Join(dir, "idem.db"), opts)
	if err != nil {
		log.Fatal(err)
	}
	if err := tel.ObserveBacklog(engine.OutboxBacklog); err != nil { // the outbox gauges
		log.Fatal(err)
	}

	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/orders", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, "order 1")
	})
	handler := otelhttp.NewHandler(idemhttp.Middleware(engine, nil)(mux), "orders", otelhttp.WithTracerProvider(tp))
	srv := httptest.NewServer(handler)
	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/orders", strings.NewReader(`{"sku":"book"}`))
		req.Header.Set("Idempotency-Key", `"order-1"`)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
	}
	srv.Close()
	tel.Close()    // stops reading the backlog,
	engine.Close() // then the engine

	for _, s := range spans.Ended() {
		outcome := ""
		for _, kv := range s.Attributes() {
			if kv.Key == idemotel.AttrOutcome {
				outcome = kv.Value.AsString()
			}
		}
		fmt.Println(strings.TrimSpace(s.Name() + " " + outcome)) // otelhttp names its span by the method
	}
	// Output:
	// idem.fn
	// idem.do executed
	// POST
	// idem.do replayed
	// POST
}
