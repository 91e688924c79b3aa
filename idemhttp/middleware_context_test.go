package idemhttp_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testkit/boltkit"
)

// hangGuard bounds a wait that must end, so that a test of a broken build
// fails instead of hanging. It is not a timing assertion.
const hangGuard = 30 * time.Second

// requestServer is a server whose outer handler reports each request's own
// context (as net/http gave it) on entry, and closes exited when its
// ServeHTTP returns, around the middleware over d and h.
type requestServer struct {
	*httptest.Server
	entered chan context.Context
	exited  chan struct{}
}

func newRequestServer(t *testing.T, d idem.Doer, h http.Handler) *requestServer {
	t.Helper()
	s := &requestServer{entered: make(chan context.Context, 16), exited: make(chan struct{}, 16)}
	mw := idemhttp.Middleware(d, nil)(h)
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.entered <- r.Context()
		defer func() { s.exited <- struct{}{} }()
		mw.ServeHTTP(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

// leave sends a POST with key whose client goes away once the server has it
// and then ready has returned: it returns when the server's request context
// has ended.
func (s *requestServer) leave(t *testing.T, key string, ready func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL, strings.NewReader("x"))
	req.Header.Set(idemhttp.HeaderKey, key)
	errc := make(chan error, 1)
	go func() {
		resp, err := s.Client().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	rc := <-s.entered
	ready()
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("the cancelled request got an answer")
	}
	<-rc.Done() // the server saw its client go
}

// TestClientGoneThenClose: a handler whose client went away runs on (its
// context is live), and Close ends its context all the same: Close cancels
// the context of every running handler, whether its client is there or not.
// The key stays started, for the recovery policy.
func TestClientGoneThenClose(t *testing.T) {
	e, path := boltkit.OpenFile(t, &idem.BoltOptions{NoSync: true}, nil)
	running := make(chan context.Context, 1)
	ended := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		running <- r.Context()
		select {
		case <-r.Context().Done():
			ended <- r.Context().Err()
		case <-time.After(hangGuard):
			ended <- errors.New("the handler's context never ended")
		}
		http.Error(w, "interrupted", http.StatusInternalServerError)
	})
	s := newRequestServer(t, e, h)
	var hctx context.Context
	s.leave(t, "k", func() { hctx = <-running })
	if err := hctx.Err(); err != nil {
		t.Fatalf("the handler's context ended with its client: %v", err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-ended; !errors.Is(err, context.Canceled) {
		t.Fatalf("the handler's context after Close: %v, want context.Canceled", err)
	}
	<-s.exited
	e, err := idem.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if rec, err := e.Get("k"); err != nil || rec.State != idem.StateStarted {
		t.Fatalf("record after Close interrupted the handler: %+v %v; want started", rec, err)
	}
}

// TestWaiterClientGone: a duplicate waiting for the first request stops
// waiting when its client goes away, and changes nothing: its handler does
// not run, the first request's outcome is recorded and replayed.
func TestWaiterClientGone(t *testing.T) {
	h := newBlocking()
	s := newRequestServer(t, openEngine(t, nil), h)
	first := make(chan string, 1)
	go func() {
		_, b, err := post(t, s.Client(), s.URL, "w", "x")
		if err != nil {
			first <- err.Error()
			return
		}
		first <- string(b)
	}()
	<-s.entered
	<-h.started
	s.leave(t, "w", func() {})
	select {
	case <-s.exited: // the waiter's ServeHTTP returned while the first runs
	case <-time.After(hangGuard):
		t.Fatal("the waiter whose client went away is still waiting")
	}
	close(h.release)
	if b := <-first; b != "run 1" {
		t.Fatalf("first: %q", b)
	}
	resp, b := mustPost(t, s.Client(), s.URL, "w", "x")
	if string(b) != "run 1" || resp.Header.Get(idemhttp.HeaderReplayed) != "true" || h.runs.Load() != 1 {
		t.Fatalf("retry: %q replayed %q, runs %d", b, resp.Header.Get(idemhttp.HeaderReplayed), h.runs.Load())
	}
}
