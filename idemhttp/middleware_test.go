package idemhttp_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
)

func TestReplay(t *testing.T) {
	o := &orders{}
	s := newServer(t, openEngine(t, nil), nil, o)
	url := s.URL + "/v1/orders"

	first, b1 := mustPost(t, s.Client(), url, "k1", `{"sku":"a"}`)
	if first.StatusCode != http.StatusCreated || first.Header.Get(idemhttp.HeaderReplayed) != "" {
		t.Fatalf("first: %d, replayed %q", first.StatusCode, first.Header.Get(idemhttp.HeaderReplayed))
	}
	if first.Header.Get("Set-Cookie") == "" || first.Header.Get("X-Not-Stored") != "yes" {
		t.Fatalf("the first caller gets every header the handler set: %v", first.Header)
	}
	second, b2 := mustPost(t, s.Client(), url, "k1", `{"sku":"a"}`)
	if second.StatusCode != http.StatusCreated || second.Header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("replay: %d, replayed %q", second.StatusCode, second.Header.Get(idemhttp.HeaderReplayed))
	}
	if !bytes.Equal(b1, b2) {
		t.Fatalf("replay body %q, first %q", b2, b1)
	}
	for _, h := range []string{"Content-Type", "Location"} {
		if second.Header.Get(h) != first.Header.Get(h) {
			t.Errorf("replayed %s = %q, first %q", h, second.Header.Get(h), first.Header.Get(h))
		}
	}
	for _, h := range []string{"Set-Cookie", "X-Not-Stored"} {
		if v := second.Header.Get(h); v != "" {
			t.Errorf("replay carries %s: %q", h, v)
		}
	}
	if second.Header.Get("Content-Length") != strconv.Itoa(len(b1)) {
		t.Errorf("replay Content-Length %q, body %d bytes", second.Header.Get("Content-Length"), len(b1))
	}
	for _, r := range []*http.Response{first, second} {
		if got := r.Header.Get(idemhttp.HeaderRetention); got != "86400" {
			t.Errorf("%s = %q, want 86400 (24 h)", idemhttp.HeaderRetention, got)
		}
	}
	if n := o.effects.Load(); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
}

func TestKeyParsing(t *testing.T) {
	tests := []struct {
		name   string
		values []string
		same   string // a header value that must name the same key
		status int    // when the key is refused
	}{
		{name: "sf-string equals raw", values: []string{`"abc"`}, same: "abc"},
		{name: "raw equals sf-string", values: []string{"abc"}, same: `"abc"`},
		{name: "escapes", values: []string{`"a\"b\\c"`}, same: `a"b\c`},
		{name: "stripe-go key, not an sf-token", values: []string{"1796107146426231270_GaGLhw"}, same: `"1796107146426231270_GaGLhw"`},
		{name: "parameters make it raw", values: []string{`"abc";p=1`}, same: `"abc";p=1`},
		{name: "unterminated is raw", values: []string{`"abc`}, same: `"abc`},
		{name: "bad escape is raw", values: []string{`"a\b"`}, same: `"a\b"`},
		{name: "empty sf-string", values: []string{`""`}, status: http.StatusBadRequest},
		{name: "blank", values: []string{"   "}, status: http.StatusBadRequest},
		{name: "twice", values: []string{"a", "b"}, status: http.StatusBadRequest},
		{name: "too long", values: []string{strings.Repeat("k", idem.MaxKeyLen+1)}, status: http.StatusBadRequest},
		{name: "longest", values: []string{strings.Repeat("k", idem.MaxKeyLen)}, same: strings.Repeat("k", idem.MaxKeyLen)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := &orders{}
			s := newServer(t, openEngine(t, nil), nil, o)
			send := func(values []string) (*http.Response, []byte) {
				req, _ := http.NewRequest(http.MethodPost, s.URL+"/v1/orders", strings.NewReader("{}"))
				req.Header[idemhttp.HeaderKey] = values
				return mustDo(t, s.Client(), req)
			}
			resp, body := send(tt.values)
			if tt.status != 0 {
				if resp.StatusCode != tt.status {
					t.Fatalf("status %d, want %d", resp.StatusCode, tt.status)
				}
				if p := problemOf(t, resp, body); p.Type != idemhttp.ProblemKeyInvalid {
					t.Fatalf("type %q", p.Type)
				}
				if o.effects.Load() != 0 {
					t.Fatal("the handler ran for a refused key")
				}
				return
			}
			if resp.StatusCode != http.StatusCreated {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			again, _ := send([]string{tt.same})
			if again.Header.Get(idemhttp.HeaderReplayed) != "true" || o.effects.Load() != 1 {
				t.Fatalf("%q after %q: replayed %q, effects %d", tt.same, tt.values, again.Header.Get(idemhttp.HeaderReplayed), o.effects.Load())
			}
		})
	}
}

func TestMethods(t *testing.T) {
	o := &orders{}
	s := newServer(t, openEngine(t, nil), nil, o)
	url := s.URL + "/v1/orders"

	resp, body := mustPost(t, s.Client(), url, "", "{}")
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("POST without a key: %d", resp.StatusCode)
	}
	p := problemOf(t, resp, body)
	if p.Type != idemhttp.ProblemKeyMissing || p.Error.Type != "idempotency_error" || p.Error.Code != "idempotency_key_missing" {
		t.Fatalf("problem %+v", p)
	}
	req, _ := http.NewRequest(http.MethodPatch, url, strings.NewReader("{}"))
	if resp, err := s.Client().Do(req); err != nil || resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("PATCH without a key: %v %v", resp, err)
	}
	if o.effects.Load() != 0 {
		t.Fatal("the handler ran without a key")
	}
	for _, m := range []string{http.MethodGet, http.MethodPut, http.MethodDelete, http.MethodOptions} {
		req, _ := http.NewRequest(m, url, nil)
		req.Header.Set(idemhttp.HeaderKey, "same")
		for range 2 {
			resp, err := s.Client().Do(req)
			if err != nil || resp.StatusCode != http.StatusCreated || resp.Header.Get(idemhttp.HeaderReplayed) != "" {
				t.Fatalf("%s passes through: %v %v", m, resp, err)
			}
		}
	}
	if o.effects.Load() != 8 {
		t.Fatalf("effects %d, want 8: other methods are not deduplicated", o.effects.Load())
	}

	t.Run("optional", func(t *testing.T) {
		o := &orders{}
		s := newServer(t, openEngine(t, nil), &idemhttp.Options{Optional: true, Methods: []string{http.MethodPut}}, o)
		if resp, _ := mustPost(t, s.Client(), s.URL, "", "{}"); resp.StatusCode != http.StatusCreated {
			t.Fatalf("POST is not in Methods: %d", resp.StatusCode)
		}
		req, _ := http.NewRequest(http.MethodPut, s.URL, nil)
		if resp, err := s.Client().Do(req); err != nil || resp.StatusCode != http.StatusCreated {
			t.Fatalf("PUT without a key, optional: %v %v", resp, err)
		}
		req.Header.Set(idemhttp.HeaderKey, "k")
		for range 2 {
			if _, err := s.Client().Do(req); err != nil {
				t.Fatal(err)
			}
		}
		if o.effects.Load() != 3 {
			t.Fatalf("effects %d, want 3", o.effects.Load())
		}
	})
}

// TestLostResponse cuts the connection after the server wrote its answer and
// before the client read it: the effect happened once, and the retry gets the
// same bytes, marked replayed.
func TestLostResponse(t *testing.T) {
	o := &orders{}
	s := newServer(t, openEngine(t, nil), nil, o)
	c := noKeepAlive()
	url := s.URL + "/v1/orders"

	s.ln.arm(1)
	if _, _, err := post(t, c, url, "lost", `{"sku":"a"}`); err == nil {
		t.Fatal("the first answer reached the client")
	}
	lost := s.ln.lostResponses(t)
	if len(lost) != 1 {
		t.Fatalf("%d responses lost", len(lost))
	}
	lostBody, _ := io.ReadAll(lost[0].Body)

	resp, body := mustPost(t, c, url, "lost", `{"sku":"a"}`)
	if resp.Header.Get(idemhttp.HeaderReplayed) != "true" || resp.StatusCode != lost[0].StatusCode {
		t.Fatalf("retry: %d, replayed %q", resp.StatusCode, resp.Header.Get(idemhttp.HeaderReplayed))
	}
	if !bytes.Equal(body, lostBody) {
		t.Fatalf("retry body %q, lost body %q", body, lostBody)
	}
	if o.effects.Load() != 1 {
		t.Fatalf("effects = %d, want 1", o.effects.Load())
	}
}

// blocking is a handler that runs until released, counting executions.
type blocking struct {
	started chan struct{}
	release chan struct{}
	runs    atomic.Int64
}

func newBlocking() *blocking {
	return &blocking{started: make(chan struct{}, 16), release: make(chan struct{})}
}

func (b *blocking) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := b.runs.Add(1)
	b.started <- struct{}{}
	<-b.release
	io.WriteString(w, "run "+strconv.FormatInt(n, 10))
}

func TestConcurrentDuplicates(t *testing.T) {
	t.Run("wait", func(t *testing.T) {
		h := newBlocking()
		s := newServer(t, openEngine(t, nil), nil, h)
		const n = 8
		answers := make(chan answer, n)
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() { postAsync(s.Client(), s.URL, "dup", "x", answers) })
		}
		<-h.started
		close(h.release)
		wg.Wait()
		close(answers)
		replays := 0
		for a := range answers {
			if a.err != nil {
				t.Fatal(a.err)
			}
			if a.body != "run 1" {
				t.Fatalf("body %q, want run 1", a.body)
			}
			if a.replayed == "true" {
				replays++
			}
		}
		if replays != n-1 || h.runs.Load() != 1 {
			t.Fatalf("replays %d, runs %d; want %d, 1", replays, h.runs.Load(), n-1)
		}
	})
	t.Run("fail fast", func(t *testing.T) {
		h := newBlocking()
		s := newServer(t, openEngine(t, &idem.Options{InFlight: idem.InFlightFail, RetryAfter: 2500 * time.Millisecond}), nil, h)
		first := make(chan error, 1)
		go func() {
			resp, b, err := post(t, s.Client(), s.URL, "dup", "x")
			if err == nil && (resp.StatusCode != http.StatusOK || string(b) != "run 1") {
				err = errors.New("first: " + resp.Status + " " + string(b))
			}
			first <- err
		}()
		<-h.started
		for range 3 {
			resp, body := mustPost(t, s.Client(), s.URL, "dup", "x")
			if resp.StatusCode != http.StatusConflict || resp.Header.Get("Retry-After") != "3" {
				t.Fatalf("duplicate: %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
			}
			if p := problemOf(t, resp, body); p.Type != idemhttp.ProblemInProgress || p.Error.Code != "idempotency_key_in_use" {
				t.Fatalf("problem %+v", p)
			}
		}
		// A different request with the key is a mismatch even while the
		// first runs.
		if resp, _ := mustPost(t, s.Client(), s.URL, "dup", "y"); resp.StatusCode != http.StatusUnprocessableEntity {
			t.Fatalf("other body while running: %d", resp.StatusCode)
		}
		close(h.release)
		if err := <-first; err != nil {
			t.Fatal(err)
		}
		if resp, b := mustPost(t, s.Client(), s.URL, "dup", "x"); resp.Header.Get(idemhttp.HeaderReplayed) != "true" || string(b) != "run 1" {
			t.Fatalf("after: %d %q", resp.StatusCode, b)
		}
		if h.runs.Load() != 1 {
			t.Fatalf("runs %d", h.runs.Load())
		}
	})
}

func TestMismatch(t *testing.T) {
	o := &orders{}
	s := newServer(t, openEngine(t, nil), nil, o)
	c := s.Client()
	mustPost(t, c, s.URL+"/v1/orders?a=1", "m", "body")
	for name, url := range map[string]string{
		"body":  s.URL + "/v1/orders?a=1",
		"query": s.URL + "/v1/orders?a=2",
		"path":  s.URL + "/v1/orders/",
	} {
		body := "body"
		if name == "body" {
			body = "other"
		}
		resp, b := mustPost(t, c, url, "m", body)
		if resp.StatusCode != http.StatusUnprocessableEntity {
			t.Fatalf("%s differs: %d", name, resp.StatusCode)
		}
		p := problemOf(t, resp, b)
		if p.Type != idemhttp.ProblemKeyMismatch || p.Error.Type != "idempotency_error" {
			t.Fatalf("%s: %+v", name, p)
		}
	}
	// The record is untouched: the first request still replays.
	if resp, _ := mustPost(t, c, s.URL+"/v1/orders?a=1", "m", "body"); resp.Header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatal("the first request no longer replays")
	}
	if o.effects.Load() != 1 {
		t.Fatalf("effects %d", o.effects.Load())
	}
}

func TestLargeBodies(t *testing.T) {
	t.Run("request", func(t *testing.T) {
		o := &orders{}
		s := newServer(t, openEngine(t, nil), &idemhttp.Options{MaxBodySize: 1000}, o)
		for _, chunked := range []bool{false, true} {
			var body io.Reader = strings.NewReader(strings.Repeat("b", 1001))
			if chunked {
				body = io.MultiReader(body) // no length known: sent chunked
			}
			req, _ := http.NewRequest(http.MethodPost, s.URL, body)
			req.Header.Set(idemhttp.HeaderKey, "big")
			resp, err := s.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusRequestEntityTooLarge || problemOf(t, resp, b).Type != idemhttp.ProblemBodyTooLarge {
				t.Fatalf("chunked %v: %d %s", chunked, resp.StatusCode, b)
			}
		}
		// Nothing was stored: the key takes another body.
		if resp, _ := mustPost(t, s.Client(), s.URL, "big", strings.Repeat("b", 1000)); resp.StatusCode != http.StatusCreated {
			t.Fatalf("at the limit: %d", resp.StatusCode)
		}
		if o.effects.Load() != 1 {
			t.Fatalf("effects %d", o.effects.Load())
		}
	})
	t.Run("response", func(t *testing.T) {
		var runs atomic.Int64
		big := bytes.Repeat([]byte("0123456789"), 1000) // 10 000 bytes
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			for i := 0; i < len(big); i += 1000 {
				w.Write(big[i : i+1000])
				w.(http.Flusher).Flush()
			}
		})
		s := newServer(t, openEngine(t, nil), &idemhttp.Options{MaxResponseSize: 4096}, h)
		resp, body := mustPost(t, s.Client(), s.URL, "big", "x")
		if resp.StatusCode != http.StatusOK || !bytes.Equal(body, big) {
			t.Fatalf("first caller: %d, %d bytes, want all %d", resp.StatusCode, len(body), len(big))
		}
		for range 2 {
			resp, b := mustPost(t, s.Client(), s.URL, "big", "x")
			if resp.StatusCode != http.StatusInternalServerError || problemOf(t, resp, b).Type != idemhttp.ProblemResponseNotStored {
				t.Fatalf("replay: %d %q", resp.StatusCode, b)
			}
		}
		if runs.Load() != 1 {
			t.Fatalf("runs %d: the handler ran again", runs.Load())
		}
	})
	t.Run("engine limit", func(t *testing.T) {
		var runs atomic.Int64
		big := bytes.Repeat([]byte("x"), 5000)
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { runs.Add(1); w.Write(big) })
		s := newServer(t, openEngine(t, &idem.Options{MaxResponseSize: 4096}), nil, h)
		if _, body := mustPost(t, s.Client(), s.URL, "big", "x"); !bytes.Equal(body, big) {
			t.Fatalf("first caller: %d bytes", len(body))
		}
		resp, b := mustPost(t, s.Client(), s.URL, "big", "x")
		if resp.StatusCode != http.StatusInternalServerError || problemOf(t, resp, b).Type != idemhttp.ProblemResponseNotStored || runs.Load() != 1 {
			t.Fatalf("replay: %d %q, runs %d", resp.StatusCode, b, runs.Load())
		}
	})
	t.Run("streamed under the limit", func(t *testing.T) {
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			for i := range 5 {
				io.WriteString(w, "chunk "+strconv.Itoa(i)+"\n")
				w.(http.Flusher).Flush()
			}
		})
		s := newServer(t, openEngine(t, nil), nil, h)
		_, first := mustPost(t, s.Client(), s.URL, "s", "x")
		resp, again := mustPost(t, s.Client(), s.URL, "s", "x")
		if resp.Header.Get(idemhttp.HeaderReplayed) != "true" || !bytes.Equal(first, again) {
			t.Fatalf("replay %q of %q", again, first)
		}
	})
}

func TestPanickingHandler(t *testing.T) {
	for _, policy := range []idem.RecoveryPolicy{idem.RecoverReexecute, idem.RecoverRefuse} {
		name := map[idem.RecoveryPolicy]string{idem.RecoverReexecute: "reexecute", idem.RecoverRefuse: "refuse"}[policy]
		t.Run(name, func(t *testing.T) {
			var runs atomic.Int64
			var recovered atomic.Bool
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if runs.Add(1) == 1 {
					panic("handler bug")
				}
				c, _ := idem.CallFrom(r.Context())
				recovered.Store(c.Recovered)
				io.WriteString(w, "ok")
			})
			s := newServer(t, openEngine(t, &idem.Options{Recovery: policy}), nil, h)
			c := noKeepAlive()
			if _, _, err := post(t, c, s.URL, "p", "x"); err == nil {
				t.Fatal("the panicking request got an answer")
			}
			resp, body := mustPost(t, c, s.URL, "p", "x")
			if policy == idem.RecoverRefuse {
				if resp.StatusCode != http.StatusConflict || problemOf(t, resp, body).Type != idemhttp.ProblemIncomplete || runs.Load() != 1 {
					t.Fatalf("refuse: %d %s, runs %d", resp.StatusCode, body, runs.Load())
				}
				return
			}
			if resp.StatusCode != http.StatusOK || string(body) != "ok" || !recovered.Load() {
				t.Fatalf("re-execution: %d %q, recovered %v", resp.StatusCode, body, recovered.Load())
			}
			if resp, _ := mustPost(t, c, s.URL, "p", "x"); resp.Header.Get(idemhttp.HeaderReplayed) != "true" || runs.Load() != 2 {
				t.Fatalf("after recovery: replayed %q, runs %d", resp.Header.Get(idemhttp.HeaderReplayed), runs.Load())
			}
		})
	}
}

func TestServerRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	o := &orders{}
	var first []byte
	for round := range 2 {
		e, err := idem.Open(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		s := newServer(t, e, nil, o)
		resp, body := mustPost(t, s.Client(), s.URL+"/v1/orders", "restart", `{"sku":"a"}`)
		if round == 0 {
			first = body
		} else if resp.Header.Get(idemhttp.HeaderReplayed) != "true" || !bytes.Equal(body, first) {
			t.Fatalf("after the restart: replayed %q, %q want %q", resp.Header.Get(idemhttp.HeaderReplayed), body, first)
		}
		// The documented order: the server first, then the engine.
		s.Close()
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if o.effects.Load() != 1 {
		t.Fatalf("effects %d", o.effects.Load())
	}
}

func TestScope(t *testing.T) {
	user := func(r *http.Request) string { return r.Header.Get("X-User") }
	send := func(t *testing.T, s *testServer, who, body string) (*http.Response, []byte) {
		req, _ := http.NewRequest(http.MethodPost, s.URL, strings.NewReader(body))
		req.Header.Set(idemhttp.HeaderKey, "shared-key")
		req.Header.Set("X-User", who)
		return mustDo(t, s.Client(), req)
	}
	t.Run("scoped", func(t *testing.T) {
		o := &orders{}
		e := openEngine(t, nil)
		s := newServer(t, e, &idemhttp.Options{Scope: user}, o)
		_, a := send(t, s, "alice", "alice's order")
		resp, b := send(t, s, "bob", "bob's order")
		if resp.StatusCode != http.StatusCreated || resp.Header.Get(idemhttp.HeaderReplayed) != "" {
			t.Fatalf("bob with alice's key: %d %s", resp.StatusCode, b)
		}
		if _, a2 := send(t, s, "alice", "alice's order"); !bytes.Equal(a, a2) {
			t.Fatalf("alice's replay %q, want %q", a2, a)
		}
		if _, b2 := send(t, s, "bob", "bob's order"); !bytes.Equal(b, b2) {
			t.Fatalf("bob's replay %q, want %q", b2, b)
		}
		if o.effects.Load() != 2 {
			t.Fatalf("effects %d", o.effects.Load())
		}
		// The stored keys are the scoped ones; the client's key is not one.
		if _, err := e.Get(idemhttp.StoredKey("alice", "shared-key")); err != nil {
			t.Fatalf("alice's stored key: %v", err)
		}
		if _, err := e.Get("shared-key"); !errors.Is(err, idem.ErrNotFound) {
			t.Fatalf("the raw key is stored: %v", err)
		}
	})
	t.Run("unscoped: one principal", func(t *testing.T) {
		s := newServer(t, openEngine(t, nil), nil, &orders{})
		send(t, s, "alice", "alice's order")
		if resp, _ := send(t, s, "bob", "bob's order"); resp.StatusCode != http.StatusUnprocessableEntity {
			t.Fatalf("without Scope, bob meets alice's key: %d", resp.StatusCode)
		}
	})
}

func TestNotStored(t *testing.T) {
	var runs atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch runs.Add(1) {
		case 1:
			if !idemhttp.NotStored(w) {
				t.Error("NotStored found no middleware")
			}
			http.Error(w, "dependency down", http.StatusServiceUnavailable)
		case 2:
			http.Error(w, "who are you", http.StatusUnauthorized)
		case 3:
			http.Error(w, "not yours", http.StatusForbidden)
		default:
			io.WriteString(w, "done")
		}
	})
	s := newServer(t, openEngine(t, nil), nil, h)
	for i, want := range []int{http.StatusServiceUnavailable, http.StatusUnauthorized, http.StatusForbidden, http.StatusOK, http.StatusOK} {
		resp, _ := mustPost(t, s.Client(), s.URL, "ns", "x")
		if resp.StatusCode != want {
			t.Fatalf("request %d: %d, want %d", i+1, resp.StatusCode, want)
		}
	}
	if runs.Load() != 4 {
		t.Fatalf("runs %d, want 4", runs.Load())
	}
	if idemhttp.NotStored(httptest.NewRecorder()) {
		t.Fatal("NotStored outside the middleware reported true")
	}
}

func TestStoreFails(t *testing.T) {
	// A real store that fails: the file opened read-only (every write is
	// refused by bbolt), and a closed engine.
	path := filepath.Join(t.TempDir(), "idem.db")
	e, err := idem.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.Close()
	ro, err := idem.OpenFile(path, &idem.BoltOptions{ReadOnly: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	closed := openEngine(t, nil)
	closed.Close()

	for name, d := range map[string]idem.Doer{"read-only": ro, "closed": closed} {
		t.Run(name, func(t *testing.T) {
			o := &orders{}
			s := newServer(t, d, &idemhttp.Options{StoreRetryAfter: 1500 * time.Millisecond}, o)
			resp, body := mustPost(t, s.Client(), s.URL, "k", "x")
			if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "2" {
				t.Fatalf("%d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
			}
			p := problemOf(t, resp, body)
			if p.Type != idemhttp.ProblemStoreUnavailable || p.Error.Type != "api_error" {
				t.Fatalf("problem %+v", p)
			}
			if o.effects.Load() != 0 {
				t.Fatal("the handler ran without protection")
			}
			u := newServer(t, d, &idemhttp.Options{RunUnprotected: true}, o)
			if resp, _ := mustPost(t, u.Client(), u.URL, "k", "x"); resp.StatusCode != http.StatusCreated || o.effects.Load() != 1 {
				t.Fatalf("RunUnprotected: %d, effects %d", resp.StatusCode, o.effects.Load())
			}
		})
	}
	if _, err := ro.Get("k"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("read-only file: %v", err)
	}
}

func TestHeadersOption(t *testing.T) {
	for _, h := range []string{"set-cookie", "Date", "content-length", idemhttp.HeaderReplayed} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Headers with %s: no panic", h)
				}
			}()
			idemhttp.Middleware(openEngine(t, nil), &idemhttp.Options{Headers: []string{h}})
		}()
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Order", "7")
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, "ok")
	})
	s := newServer(t, openEngine(t, nil), &idemhttp.Options{Headers: []string{"x-order"}}, h)
	mustPost(t, s.Client(), s.URL, "h", "x")
	resp, _ := mustPost(t, s.Client(), s.URL, "h", "x")
	if resp.Header.Get("X-Order") != "7" || resp.Header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("replayed headers %v", resp.Header)
	}
	if ct := resp.Header.Get("Content-Type"); ct == "text/plain" {
		t.Fatalf("Content-Type stored though not listed")
	}
}

func TestClientGoneHandlerFinishes(t *testing.T) {
	// The client gives up while the handler runs; the handler's context
	// does not end, its outcome is recorded and the retry replays it.
	var runs atomic.Int64
	started := make(chan struct{})
	release := make(chan struct{})
	ctxErr := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		close(started)
		<-release
		ctxErr <- r.Context().Err()
		io.WriteString(w, "finished")
	})
	e := openEngine(t, nil)
	s := newServer(t, e, nil, h)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL, strings.NewReader("x"))
	req.Header.Set(idemhttp.HeaderKey, "gone")
	errc := make(chan error, 1)
	go func() {
		_, err := s.Client().Do(req)
		errc <- err
	}()
	<-started
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("the cancelled request got an answer")
	}
	close(release)
	if err := <-ctxErr; err != nil {
		t.Fatalf("the handler's context ended with the client: %v", err)
	}
	resp, body := mustPost(t, s.Client(), s.URL, "gone", "x") // waits for the first
	if string(body) != "finished" || resp.Header.Get(idemhttp.HeaderReplayed) != "true" || runs.Load() != 1 {
		t.Fatalf("retry: %q replayed %q runs %d", body, resp.Header.Get(idemhttp.HeaderReplayed), runs.Load())
	}
}

// TestEngineClosedFirst closes the engine under a running handler (the wrong
// shutdown order): the handler's context ends, its caller gets its answer,
// and the key stays started, so the next request with it re-executes.
func TestEngineClosedFirst(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	e, err := idem.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	var runs atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			close(started)
			<-r.Context().Done()
			http.Error(w, "interrupted", http.StatusInternalServerError)
			return
		}
		io.WriteString(w, "done")
	})
	s := newServer(t, e, nil, h)
	first := make(chan answer, 1)
	go postAsync(s.Client(), s.URL, "k", "x", first)
	<-started
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if a := <-first; a.err != nil || a.status != http.StatusInternalServerError {
		t.Fatalf("the interrupted request: %+v", a)
	}
	s.Close()

	e, err = idem.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if rec, err := e.Get("k"); err != nil || rec.State != idem.StateStarted {
		t.Fatalf("record after the interruption: %+v %v", rec, err)
	}
	s = newServer(t, e, nil, h)
	if resp, body := mustPost(t, s.Client(), s.URL, "k", "x"); resp.StatusCode != http.StatusOK || string(body) != "done" || runs.Load() != 2 {
		t.Fatalf("re-execution: %d %q, runs %d", resp.StatusCode, body, runs.Load())
	}
}

// TestNotStoredWithWaiters: duplicates waiting for a first request whose
// response is not stored try the key again; one of them runs the handler,
// the others get its replay.
func TestNotStoredWithWaiters(t *testing.T) {
	var runs atomic.Int64
	started := make(chan struct{})
	release := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		if n == 1 {
			close(started)
			<-release
			idemhttp.NotStored(w)
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "run "+strconv.FormatInt(n, 10))
	})
	s := newServer(t, openEngine(t, nil), nil, h)
	send := func(out chan<- answer) { postAsync(s.Client(), s.URL, "w", "x", out) }
	first := make(chan answer, 1)
	go send(first)
	<-started
	const n = 4
	others := make(chan answer, n)
	for range n {
		go send(others)
	}
	// Let the duplicates reach the engine and wait there. Whether they do
	// changes only which path they take, not what they must get.
	for s.faults.hits.Load() < n+1 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	close(release)
	if a := <-first; a.err != nil || a.status != http.StatusServiceUnavailable {
		t.Fatalf("first: %+v", a)
	}
	for range n {
		if a := <-others; a.err != nil || a.status != http.StatusOK || a.body != "run 2" {
			t.Fatalf("duplicate: %+v", a)
		}
	}
	if runs.Load() != 2 {
		t.Fatalf("runs %d, want 2", runs.Load())
	}
}

// The key rules are the engine's whether or not Scope hashes the client's
// key into the stored one: a key with white space at an end or a format
// character (the engine's ErrInvalidKey) is refused with 400 in both cases,
// not stored under a hash that hides it.
func TestKeyRulesWithAndWithoutScope(t *testing.T) {
	for _, scoped := range []bool{false, true} {
		t.Run(map[bool]string{false: "unscoped", true: "scoped"}[scoped], func(t *testing.T) {
			var opts *idemhttp.Options
			if scoped {
				opts = &idemhttp.Options{Scope: func(*http.Request) string { return "alice" }}
			}
			o := &orders{}
			s := newServer(t, openEngine(t, nil), opts, o)
			for _, key := range []string{"k\u00a0", "\u00a0k", `" k"`, "\ufeffk", "k\u200bk"} {
				resp, body := mustPost(t, s.Client(), s.URL, key, "x")
				if resp.StatusCode != http.StatusBadRequest || problemOf(t, resp, body).Type != idemhttp.ProblemKeyInvalid {
					t.Errorf("key %q: %d %s", key, resp.StatusCode, body)
				}
			}
			if o.effects.Load() != 0 {
				t.Fatalf("%d effects under refused keys", o.effects.Load())
			}
		})
	}
}
