package idemhttp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
)

// fastTransport is a Transport with short backoff waits, a connection per
// attempt.
func fastTransport() *idemhttp.Transport {
	return &idemhttp.Transport{
		Base:            &http.Transport{DisableKeepAlives: true},
		InitialInterval: time.Millisecond,
		MaxInterval:     5 * time.Millisecond,
		MaxElapsedTime:  10 * time.Second,
	}
}

// onlyReader hides everything but Read, so http.NewRequest sets no GetBody.
type onlyReader struct{ r io.Reader }

func (o onlyReader) Read(p []byte) (int, error) { return o.r.Read(p) }

func TestTransportRetries(t *testing.T) {
	o := &orders{}
	s := newServer(t, openEngine(t, nil), nil, o)
	c := &http.Client{Transport: fastTransport()}
	type fault struct{ drop, before, after int }
	plan := []fault{{}, {drop: 1}, {after: 1}, {before: 1}, {drop: 2, after: 2, before: 2}}
	for _, getBody := range []bool{true, false} {
		for i, f := range plan {
			s.ln.arm(f.drop)
			s.faults.before.Add(int32(f.before))
			s.faults.after.Add(int32(f.after))
			want := fmt.Sprintf("order %d %v", i, getBody)
			var body io.Reader = strings.NewReader(want)
			if !getBody {
				body = onlyReader{body}
			}
			req, _ := http.NewRequest(http.MethodPost, s.URL+"/v1/orders", body)
			if (req.GetBody != nil) != getBody {
				t.Fatalf("GetBody set: %v", req.GetBody != nil)
			}
			resp, err := c.Do(req)
			if err != nil {
				t.Fatalf("request %d %+v: %v", i, f, err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var got order
			if err := json.Unmarshal(b, &got); err != nil || got.Body != want || resp.StatusCode != http.StatusCreated {
				t.Fatalf("request %d %+v: %d %s", i, f, resp.StatusCode, b)
			}
			if wantReplay := f.drop > 0 || f.after > 0; (resp.Header.Get(idemhttp.HeaderReplayed) == "true") != wantReplay {
				t.Fatalf("request %d %+v: replayed %q", i, f, resp.Header.Get(idemhttp.HeaderReplayed))
			}
		}
	}
	if n := o.effects.Load(); n != int64(2*len(plan)) {
		t.Fatalf("effects %d for %d logical requests", n, 2*len(plan))
	}
}

// echoKey answers with the Idempotency-Key header it received.
func echoKey(runs *atomic.Int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		io.WriteString(w, r.Header.Get(idemhttp.HeaderKey))
	})
}

func TestTransportKeys(t *testing.T) {
	var runs atomic.Int64
	s := newServer(t, openEngine(t, nil), &idemhttp.Options{Optional: true, Methods: []string{http.MethodPost, http.MethodPatch, http.MethodGet}}, echoKey(&runs))
	c := &http.Client{Transport: fastTransport()}
	send := func(ctx context.Context, method, key string) (*http.Response, string) {
		req, _ := http.NewRequestWithContext(ctx, method, s.URL, strings.NewReader("x"))
		if key != "" {
			req.Header.Set(idemhttp.HeaderKey, key)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	ctx := context.Background()

	_, minted := send(ctx, http.MethodPost, "")
	if len(minted) != 24 || minted[0] != '"' || minted[23] != '"' {
		t.Fatalf("minted key %q: want a 22-character sf-string", minted)
	}
	if _, other := send(ctx, http.MethodPost, ""); other == minted {
		t.Fatal("two logical requests got one key")
	}
	if _, kept := send(ctx, http.MethodPatch, "mine"); kept != "mine" {
		t.Fatalf("the caller's key became %q", kept)
	}
	pinned := idemhttp.WithKey(ctx, "pinned-1")
	first, k1 := send(pinned, http.MethodPost, "")
	second, k2 := send(pinned, http.MethodPost, "")
	if k1 != `"pinned-1"` || k2 != k1 || first.Header.Get(idemhttp.HeaderReplayed) != "" || second.Header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("pinned: %q %q, replayed %q", k1, k2, second.Header.Get(idemhttp.HeaderReplayed))
	}
	if _, none := send(ctx, http.MethodGet, ""); none != "" {
		t.Fatalf("GET got a key: %q", none)
	}
}

func TestTransportInProgress(t *testing.T) {
	h := newBlocking()
	s := newServer(t, openEngine(t, &idem.Options{InFlight: idem.InFlightFail}), nil, h)
	first := make(chan answer, 1)
	go postAsync(http.DefaultClient, s.URL, "busy", "x", first)
	<-h.started
	second := make(chan answer, 1)
	req, _ := http.NewRequestWithContext(idemhttp.WithKey(context.Background(), "busy"), http.MethodPost, s.URL, strings.NewReader("x"))
	go doAsync(&http.Client{Transport: fastTransport()}, req, second)
	for s.faults.hits.Load() < 2 { // the duplicate got its 409 (Retry-After: 1)
		time.Sleep(time.Millisecond)
	}
	close(h.release)
	if a := <-first; a.err != nil {
		t.Fatal(a.err)
	}
	a := <-second
	if a.err != nil || a.replayed != "true" || a.body != "run 1" || h.runs.Load() != 1 {
		t.Fatalf("after the 409: %+v, runs %d", a, h.runs.Load())
	}
}

func TestTransportGivesUp(t *testing.T) {
	e := openEngine(t, nil)
	e.Close() // every request: 503 with Retry-After: 1
	s := newServer(t, e, nil, &orders{})
	tr := fastTransport()
	tr.MaxElapsedTime = 500 * time.Millisecond // shorter than the Retry-After
	req, _ := http.NewRequest(http.MethodPost, s.URL, strings.NewReader("x"))
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || s.faults.hits.Load() != 1 {
		t.Fatalf("%d after %d attempts: the wait would pass the deadline", resp.StatusCode, s.faults.hits.Load())
	}

	// A refusal that is not retried comes back at once.
	s2 := newServer(t, openEngine(t, nil), nil, &orders{})
	c := &http.Client{Transport: fastTransport()}
	ctx := idemhttp.WithKey(context.Background(), "k")
	for i, body := range []string{"a", "b"} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s2.URL, strings.NewReader(body))
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if i == 1 && (resp.StatusCode != http.StatusUnprocessableEntity || s2.faults.hits.Load() != 2) {
			t.Fatalf("mismatch: %d after %d requests", resp.StatusCode, s2.faults.hits.Load())
		}
	}

	// The caller's context ends the retries with its error.
	s.faults.before.Store(1 << 20)
	cctx, cancel := context.WithCancel(context.Background())
	tr = fastTransport()
	tr.InitialInterval = time.Hour
	tr.MaxInterval = time.Hour
	tr.MaxElapsedTime = 2 * time.Hour
	req, _ = http.NewRequestWithContext(cctx, http.MethodPost, s.URL, strings.NewReader("x"))
	go func() {
		for s.faults.hits.Load() < 2 {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	if _, err := (&http.Client{Transport: tr}).Do(req); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}

func TestTransportLargeBodyWithoutGetBody(t *testing.T) {
	o := &orders{}
	s := newServer(t, openEngine(t, nil), nil, o)
	tr := fastTransport()
	tr.MaxBodyBuffer = 100
	c := &http.Client{Transport: tr}
	big := bytes.Repeat([]byte("b"), 1000)
	for i, before := range []int32{0, 1} {
		s.faults.before.Store(before)
		hits := s.faults.hits.Load()
		req, _ := http.NewRequest(http.MethodPost, s.URL, onlyReader{bytes.NewReader(big)})
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if n := s.faults.hits.Load() - hits; n != 1 {
			t.Fatalf("request %d: sent %d times", i, n)
		}
		if before == 0 {
			var got order
			if err := json.Unmarshal(b, &got); err != nil || got.Body != string(big) {
				t.Fatalf("the body did not arrive whole: %s", b)
			}
		} else if resp.StatusCode != http.StatusBadGateway {
			t.Fatalf("the 502 came back as %d", resp.StatusCode)
		}
	}
}

func TestTransportConflicts(t *testing.T) {
	// A first execution interrupted under RecoverRefuse: 409
	// ProblemIncomplete, which waiting does not change: not retried.
	var runs atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			panic("interrupted")
		}
	})
	s := newServer(t, openEngine(t, &idem.Options{Recovery: idem.RecoverRefuse}), nil, h)
	if _, _, err := post(t, noKeepAlive(), s.URL, "k", "x"); err == nil {
		t.Fatal("the panicking request got an answer")
	}
	hits := s.faults.hits.Load()
	req, _ := http.NewRequestWithContext(idemhttp.WithKey(context.Background(), "k"), http.MethodPost, s.URL, strings.NewReader("x"))
	resp, err := (&http.Client{Transport: fastTransport()}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict || s.faults.hits.Load()-hits != 1 || problemOf(t, resp, body).Type != idemhttp.ProblemIncomplete {
		t.Fatalf("%d %s after %d requests", resp.StatusCode, body, s.faults.hits.Load()-hits)
	}

	// Any other 409 (Stripe's idempotency_key_in_use has no Retry-After) is
	// retried with backoff.
	var conflicts atomic.Int64
	plain := httptestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if conflicts.Add(1) <= 2 {
			http.Error(w, `{"error":{"type":"idempotency_error","code":"idempotency_key_in_use"}}`, http.StatusConflict)
			return
		}
		io.WriteString(w, "ok")
	}))
	req, _ = http.NewRequest(http.MethodPost, plain, strings.NewReader("x"))
	resp, err = (&http.Client{Transport: fastTransport()}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != "ok" || conflicts.Load() != 3 {
		t.Fatalf("%d %q after %d requests", resp.StatusCode, body, conflicts.Load())
	}
}

func httptestServer(t *testing.T, h http.Handler) string {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// A Retry-After of 0, or an HTTP date already past, is no reason to retry at
// once: the attempts would follow one another without a pause until
// MaxElapsedTime (thousands a second). Such a wait gives way to the
// exponential backoff, whose first wait here (an hour, jitter included at
// least half) passes the deadline, so the one answer comes back.
func TestTransportRetryAfterZeroBacksOff(t *testing.T) {
	for _, ra := range []string{"0", "Thu, 01 Jan 1970 00:00:00 GMT"} {
		t.Run(ra, func(t *testing.T) {
			var hits atomic.Int64
			url := httptestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				hits.Add(1)
				w.Header().Set("Retry-After", ra)
				w.WriteHeader(http.StatusServiceUnavailable)
			}))
			tr := fastTransport()
			tr.InitialInterval = time.Hour
			tr.MaxInterval = time.Hour
			tr.MaxElapsedTime = time.Second
			resp, err := (&http.Client{Transport: tr}).Post(url, "text/plain", strings.NewReader("x"))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusServiceUnavailable || hits.Load() != 1 {
				t.Fatalf("%d after %d attempts: Retry-After %q retried without a pause", resp.StatusCode, hits.Load(), ra)
			}
		})
	}
}
