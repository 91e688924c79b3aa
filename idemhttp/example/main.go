// Command example is an order service behind the Idempotency-Key middleware:
// POST /v1/orders creates an order once per idempotency key and user,
// however often the client retries.
//
//	go run ./idemhttp/example -addr 127.0.0.1:8080 -db orders.db
//	curl -i -X POST -H 'Authorization: Bearer alice' -H 'Idempotency-Key: "order-1"' \
//	     -d '{"sku":"book","quantity":1}' http://127.0.0.1:8080/v1/orders
//
// Send the curl twice: the second answer is the first one's bytes, with
// Idempotent-Replayed: true. Another body with the same key gets 422; another
// user with the same key gets an order of its own. On SIGINT or SIGTERM the
// HTTP server shuts down first, then the engine closes (see the package
// documentation's "Shutdown order").
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "address to listen on")
	db := flag.String("db", "orders.db", "idem file")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("serving POST /v1/orders on http://%s", ln.Addr())
	if err := run(ctx, ln, *db); err != nil {
		log.Fatal(err)
	}
}

// run serves on ln until ctx ends, then shuts down in the documented order:
// the HTTP server first (running handlers finish and are recorded), the
// engine last.
func run(ctx context.Context, ln net.Listener, path string) error {
	engine, err := idem.Open(path, nil)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: newService(engine), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	select {
	case err = <-served:
	case <-ctx.Done():
	}
	shutCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if serr := srv.Shutdown(shutCtx); serr != nil && err == nil { // 1. the HTTP server
		err = serr
	}
	if cerr := engine.Close(); cerr != nil && err == nil { // 2. the engine
		err = cerr
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// newService is the API: authentication, then the middleware (scoped by
// user), then the routes.
func newService(d idem.Doer) http.Handler {
	s := &store{orders: map[string]Order{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/orders", s.create)
	mux.HandleFunc("GET /v1/orders/{id}", s.get)
	idempotent := idemhttp.Middleware(d, &idemhttp.Options{Scope: userOf})
	return authenticate(idempotent(mux))
}

type userKey struct{}

// authenticate stands for real authentication: the bearer token is the user.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || user == "" {
			http.Error(w, "missing bearer token", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), userKey{}, user)))
	})
}

func userOf(r *http.Request) string { u, _ := r.Context().Value(userKey{}).(string); return u }

// Order is what POST /v1/orders creates.
type Order struct {
	ID       string `json:"id"`
	User     string `json:"user"`
	SKU      string `json:"sku"`
	Quantity int    `json:"quantity"`
}

// store keeps orders in memory; a real service writes them to its database.
type store struct {
	mu     sync.Mutex
	n      int
	orders map[string]Order
}

func (s *store) create(w http.ResponseWriter, r *http.Request) {
	var in struct {
		SKU      string `json:"sku"`
		Quantity int    `json:"quantity"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.SKU == "" || in.Quantity < 1 {
		// A validation failure: not an execution, so not stored (Stripe's
		// rule); the client may correct the body and reuse the key.
		idemhttp.NotStored(w)
		http.Error(w, "want {\"sku\": non-empty, \"quantity\": >= 1}", http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	s.n++
	o := Order{ID: fmt.Sprintf("ord_%d", s.n), User: userOf(r), SKU: in.SKU, Quantity: in.Quantity}
	s.orders[o.ID] = o
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/v1/orders/"+o.ID)
	w.WriteHeader(http.StatusCreated)
	json.NewEncoder(w).Encode(o)
}

func (s *store) get(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	o, ok := s.orders[r.PathValue("id")]
	s.mu.Unlock()
	if !ok || o.User != userOf(r) {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(o)
}
