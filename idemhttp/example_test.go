package idemhttp_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
)

// The middleware in front of a handler with an effect: the retry gets the
// first answer back, marked replayed, and the handler runs once.
func ExampleMiddleware() {
	dir, _ := os.MkdirTemp("", "idemhttp")
	defer os.RemoveAll(dir)
	engine, err := idem.Open(filepath.Join(dir, "idem.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	created := 0
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/orders", func(w http.ResponseWriter, r *http.Request) {
		created++
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "order %d", created)
	})
	srv := httptest.NewServer(idemhttp.Middleware(engine, nil)(mux))

	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/orders", strings.NewReader(`{"sku":"book"}`))
		req.Header.Set("Idempotency-Key", `"order-1"`)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, string(body), "replayed:", resp.Header.Get("Idempotent-Replayed") == "true")
	}
	fmt.Println("created:", created)

	srv.Close()    // the HTTP server first,
	engine.Close() // the engine last
	// Output:
	// 201 order 1 replayed: false
	// 201 order 1 replayed: true
	// created: 1
}

// The Transport gives a logical request one key and retries it; WithKey pins
// a key across the caller's own retries.
func ExampleTransport() {
	dir, _ := os.MkdirTemp("", "idemhttp")
	defer os.RemoveAll(dir)
	engine, err := idem.Open(filepath.Join(dir, "idem.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	srv := httptest.NewServer(idemhttp.Middleware(engine, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "charged")
	})))
	client := &http.Client{Transport: &idemhttp.Transport{}}

	ctx := idemhttp.WithKey(context.Background(), "charge-42")
	for range 2 { // the caller's own retry loop
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader("amount=100"))
		resp, err := client.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(string(body), "replayed:", resp.Header.Get("Idempotent-Replayed") == "true")
	}
	srv.Close()
	engine.Close()
	// Output:
	// charged replayed: false
	// charged replayed: true
}
