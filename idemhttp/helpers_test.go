package idemhttp_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testkit/boltkit"
)

// openEngine opens a bbolt engine on a temporary file, closed and checked
// when the test ends.
func openEngine(t *testing.T, opts *idem.Options) *idem.Engine {
	t.Helper()
	// No crash in these tests: fsync only costs time.
	e, _ := boltkit.OpenFile(t, &idem.BoltOptions{NoSync: true}, opts)
	return e
}

// cutListener wraps a server's listener so that a test can lose responses:
// when armed, the next response written on any connection is swallowed (the
// server sees it written, in full) and the connection is closed before the
// client reads a byte, as when a network drops the answer.
type cutListener struct {
	net.Listener
	cuts atomic.Int32
	mu   sync.Mutex
	lost [][]byte // the raw responses swallowed
}

func (l *cutListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &cutConn{Conn: c, l: l}, nil
}

// arm makes the next n responses get lost.
func (l *cutListener) arm(n int) { l.cuts.Add(int32(n)) }

func (l *cutListener) take() bool {
	for {
		n := l.cuts.Load()
		if n <= 0 {
			return false
		}
		if l.cuts.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

// lostResponses returns the responses swallowed so far, parsed.
func (l *cutListener) lostResponses(t *testing.T) []*http.Response {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []*http.Response
	for _, raw := range l.lost {
		resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(raw)), nil)
		if err != nil {
			t.Fatalf("parse lost response: %v", err)
		}
		out = append(out, resp)
	}
	return out
}

type cutConn struct {
	net.Conn
	l   *cutListener
	cut atomic.Bool
}

func (c *cutConn) Write(p []byte) (int, error) {
	if c.cut.Load() {
		return len(p), nil
	}
	if !c.l.take() {
		return c.Conn.Write(p)
	}
	c.cut.Store(true)
	c.l.mu.Lock()
	c.l.lost = append(c.l.lost, append([]byte(nil), p...))
	c.l.mu.Unlock()
	c.Conn.Close()
	return len(p), nil
}

// faults injects 5xx answers in front of the service, as a gateway would:
// "before" answers 502 without reaching the service, "after" lets the
// service run and replaces its answer with 502 (the effect happened, the
// client does not know).
type faults struct {
	next   http.Handler
	before atomic.Int32
	after  atomic.Int32
	hits   atomic.Int32 // every request that reached the server
}

func (f *faults) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.hits.Add(1)
	if take(&f.before) {
		http.Error(w, "bad gateway (injected)", http.StatusBadGateway)
		return
	}
	if take(&f.after) {
		f.next.ServeHTTP(httptest.NewRecorder(), r)
		http.Error(w, "bad gateway (injected, after the effect)", http.StatusBadGateway)
		return
	}
	f.next.ServeHTTP(w, r)
}

func take(n *atomic.Int32) bool {
	for {
		v := n.Load()
		if v <= 0 {
			return false
		}
		if n.CompareAndSwap(v, v-1) {
			return true
		}
	}
}

// testServer is a real net/http server on loopback: faults, then the
// middleware over d, then the handler.
type testServer struct {
	*httptest.Server
	ln     *cutListener
	faults *faults
}

func newServer(t *testing.T, d idem.Doer, opts *idemhttp.Options, h http.Handler) *testServer {
	t.Helper()
	f := &faults{next: idemhttp.Middleware(d, opts)(h)}
	srv := httptest.NewUnstartedServer(f)
	ln := &cutListener{Listener: srv.Listener}
	srv.Listener = ln
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the panicking handler's stack
	srv.Start()
	t.Cleanup(srv.Close)
	return &testServer{Server: srv, ln: ln, faults: f}
}

// orders is the service under test: each execution is one effect, counted,
// answered with the order it created.
type orders struct {
	effects atomic.Int64
	mu      sync.Mutex
	created []string // order ids, in order
}

type order struct {
	ID   string `json:"id"`
	Body string `json:"body"`
}

func (o *orders) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	n := o.effects.Add(1)
	id := fmt.Sprintf("ord_%d", n)
	o.mu.Lock()
	o.created = append(o.created, id)
	o.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/v1/orders/"+id)
	w.Header().Set("Set-Cookie", "session="+id)
	w.Header().Set("X-Not-Stored", "yes")
	w.WriteHeader(http.StatusCreated)
	json.NewEncoder(w).Encode(order{ID: id, Body: string(body)})
}

// post sends one POST with key (none if empty) through c.
func post(t *testing.T, c *http.Client, url, key, body string) (*http.Response, []byte, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set(idemhttp.HeaderKey, key)
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, b, err
}

// answer is an HTTP answer, or the error of its request.
type answer struct {
	status   int
	replayed string // the Idempotent-Replayed header
	body     string
	err      error
}

// postAsync sends one POST with key through c and puts its answer on out;
// it is for a goroutine of its own, so it reports failures on out only.
func postAsync(c *http.Client, url, key, body string, out chan<- answer) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		out <- answer{err: err}
		return
	}
	req.Header.Set(idemhttp.HeaderKey, key)
	doAsync(c, req, out)
}

// doAsync sends req through c and puts its answer on out, as postAsync.
func doAsync(c *http.Client, req *http.Request, out chan<- answer) {
	resp, err := c.Do(req)
	if err != nil {
		out <- answer{err: err}
		return
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	out <- answer{status: resp.StatusCode, replayed: resp.Header.Get(idemhttp.HeaderReplayed), body: string(b), err: err}
}

// mustDo sends req through c and reads its answer whole; a transport error
// fails the test.
func mustDo(t *testing.T, c *http.Client, req *http.Request) (*http.Response, []byte) {
	t.Helper()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// mustPost is post that fails the test on a transport error.
func mustPost(t *testing.T, c *http.Client, url, key, body string) (*http.Response, []byte) {
	t.Helper()
	resp, b, err := post(t, c, url, key, body)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	return resp, b
}

// problemOf decodes a problem details body.
type problemBody struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Error  struct {
		Type string `json:"type"`
		Code string `json:"code"`
	} `json:"error"`
}

func problemOf(t *testing.T, resp *http.Response, body []byte) problemBody {
	t.Helper()
	if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type = %q, want application/problem+json; body %s", ct, body)
	}
	var p problemBody
	if err := json.Unmarshal(body, &p); err != nil {
		t.Fatalf("problem body %q: %v", body, err)
	}
	if p.Status != resp.StatusCode {
		t.Fatalf("problem status %d, response status %d", p.Status, resp.StatusCode)
	}
	return p
}

// noKeepAlive is a client that opens a connection per request, so a lost
// response shows as an error to the caller rather than as a silent retry of
// net/http's own on a reused connection.
func noKeepAlive() *http.Client {
	return &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
}
