package idemhttp_test

// Real clients nobody here wrote, against the middleware on a loopback
// server with injected connection drops and 5xx: each logical request has
// exactly one effect, counted. They also pin down what the package
// documentation says each client does with each refusal.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-retryablehttp"
	"github.com/stripe/stripe-go/v82"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
)

// customers is a Stripe-shaped service: POST /v1/customers creates one.
type customers struct {
	effects atomic.Int64
	mu      sync.Mutex
	byEmail map[string][]string // the ids created for each email
	hold    chan struct{}       // when set, creations signal entered and wait on it
	entered chan struct{}
	flaky   atomic.Int32 // answer this many 500s (not stored, not Stripe-shaped)
}

func (c *customers) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/customers" {
		http.NotFound(w, r)
		return
	}
	if take(&c.flaky) {
		idemhttp.NotStored(w)
		http.Error(w, "database timeout", http.StatusInternalServerError)
		return
	}
	if err := r.ParseForm(); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if c.hold != nil {
		c.entered <- struct{}{}
		<-c.hold
	}
	n := c.effects.Add(1)
	id := fmt.Sprintf("cus_%d", n)
	email := r.PostForm.Get("email")
	c.mu.Lock()
	if c.byEmail == nil {
		c.byEmail = map[string][]string{}
	}
	c.byEmail[email] = append(c.byEmail[email], id)
	c.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"id": id, "object": "customer", "email": email})
}

func newStripe(t *testing.T, url string) *stripe.Client {
	t.Helper()
	be := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL: stripe.String(url),
		// A connection per request: a lost answer reaches stripe-go as an
		// error, not as a silent retry of net/http's.
		HTTPClient:    &http.Client{Transport: &http.Transport{DisableKeepAlives: true}},
		LeveledLogger: &stripe.LeveledLogger{Level: stripe.LevelNull},
	}).(*stripe.BackendImplementation)
	be.SetNetworkRetriesSleep(false)
	return stripe.NewClient("sk_test_idemhttp", stripe.WithBackends(&stripe.Backends{API: be, Connect: be, Uploads: be, MeterEvents: be}))
}

func TestStripeGo(t *testing.T) {
	c := &customers{}
	s := newServer(t, openEngine(t, nil), nil, c)
	sc := newStripe(t, s.URL)
	ctx := context.Background()

	// Each logical request meets at most two faults: stripe-go retries
	// twice by default, with its own key.
	type fault struct{ drop, before, after, flaky int }
	plan := []fault{{}, {drop: 1}, {after: 1}, {before: 1}, {drop: 1, after: 1}, {drop: 2}, {after: 2}, {flaky: 1}, {flaky: 1, drop: 1}}
	for i, f := range plan {
		s.ln.arm(f.drop)
		s.faults.before.Add(int32(f.before))
		s.faults.after.Add(int32(f.after))
		c.flaky.Add(int32(f.flaky))
		email := fmt.Sprintf("user%d@example.com", i)
		cus, err := sc.V1Customers.Create(ctx, &stripe.CustomerCreateParams{Email: stripe.String(email)})
		if err != nil {
			t.Fatalf("request %d %+v: %v", i, f, err)
		}
		c.mu.Lock()
		ids := c.byEmail[email]
		c.mu.Unlock()
		if len(ids) != 1 || cus.ID != ids[0] {
			t.Fatalf("request %d %+v: got %s, created %v", i, f, cus.ID, ids)
		}
		// A drop meets the first answer: the flaky 500 when there is one.
		wantReplay := f.after > 0 || f.drop > f.flaky
		if got := cus.LastResponse.Header.Get(idemhttp.HeaderReplayed) == "true"; got != wantReplay {
			t.Errorf("request %d %+v: replayed %v", i, f, got)
		}
	}
	if n := c.effects.Load(); n != int64(len(plan)) {
		t.Fatalf("effects %d for %d logical requests", n, len(plan))
	}
	if s.ln.cuts.Load() != 0 || s.faults.before.Load() != 0 || s.faults.after.Load() != 0 || c.flaky.Load() != 0 {
		t.Fatal("not every injected fault was met")
	}
}

// stripeError asserts err is a *stripe.Error of typ with status.
func stripeError(t *testing.T, err error, status int, typ stripe.ErrorType, code string) {
	t.Helper()
	var se *stripe.Error
	if !errors.As(err, &se) {
		t.Fatalf("error %T %v, want *stripe.Error", err, err)
	}
	if se.HTTPStatusCode != status || se.Type != typ || string(se.Code) != code {
		t.Fatalf("stripe error %d %s %s, want %d %s %s", se.HTTPStatusCode, se.Type, se.Code, status, typ, code)
	}
}

func TestStripeGoRefusals(t *testing.T) {
	ctx := context.Background()
	t.Run("422: no retry", func(t *testing.T) {
		c := &customers{}
		s := newServer(t, openEngine(t, nil), nil, c)
		sc := newStripe(t, s.URL)
		p := &stripe.CustomerCreateParams{Email: stripe.String("a@example.com")}
		p.SetIdempotencyKey("fixed")
		if _, err := sc.V1Customers.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		hits := s.faults.hits.Load()
		p = &stripe.CustomerCreateParams{Email: stripe.String("b@example.com")}
		p.SetIdempotencyKey("fixed")
		_, err := sc.V1Customers.Create(ctx, p)
		stripeError(t, err, http.StatusUnprocessableEntity, stripe.ErrorTypeIdempotency, "idempotency_key_mismatch")
		var ie *stripe.IdempotencyError
		if !errors.As(err, &ie) {
			t.Fatalf("no *stripe.IdempotencyError in %v", err)
		}
		if n := s.faults.hits.Load() - hits; n != 1 {
			t.Fatalf("stripe-go sent the mismatch %d times, want 1", n)
		}
	})
	t.Run("409: no retry", func(t *testing.T) {
		c := &customers{hold: make(chan struct{}), entered: make(chan struct{}, 1)}
		s := newServer(t, openEngine(t, &idem.Options{InFlight: idem.InFlightFail}), nil, c)
		sc := newStripe(t, s.URL)
		p := func() *stripe.CustomerCreateParams {
			p := &stripe.CustomerCreateParams{Email: stripe.String("a@example.com")}
			p.SetIdempotencyKey("busy")
			return p
		}
		done := make(chan error, 1)
		go func() {
			_, err := sc.V1Customers.Create(ctx, p())
			done <- err
		}()
		<-c.entered
		hits := s.faults.hits.Load()
		_, err := sc.V1Customers.Create(ctx, p())
		if n := s.faults.hits.Load() - hits; n != 1 {
			t.Fatalf("stripe-go sent the 409 request %d times, want 1", n)
		}
		stripeError(t, err, http.StatusConflict, stripe.ErrorTypeIdempotency, "idempotency_key_in_use")
		close(c.hold)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if c.effects.Load() != 1 {
			t.Fatalf("effects %d", c.effects.Load())
		}
	})
	t.Run("503: no retry", func(t *testing.T) {
		e := openEngine(t, nil)
		e.Close()
		c := &customers{}
		s := newServer(t, e, nil, c)
		_, err := newStripe(t, s.URL).V1Customers.Create(ctx, &stripe.CustomerCreateParams{Email: stripe.String("a@example.com")})
		stripeError(t, err, http.StatusServiceUnavailable, stripe.ErrorTypeAPI, "idempotency_store_unavailable")
		if s.faults.hits.Load() != 1 || c.effects.Load() != 0 {
			t.Fatalf("hits %d, effects %d", s.faults.hits.Load(), c.effects.Load())
		}
	})
	t.Run("500 not Stripe-shaped: retried", func(t *testing.T) {
		c := &customers{}
		c.flaky.Store(2)
		s := newServer(t, openEngine(t, nil), nil, c)
		if _, err := newStripe(t, s.URL).V1Customers.Create(ctx, &stripe.CustomerCreateParams{Email: stripe.String("a@example.com")}); err != nil {
			t.Fatal(err)
		}
		if s.faults.hits.Load() != 3 || c.effects.Load() != 1 {
			t.Fatalf("hits %d, effects %d", s.faults.hits.Load(), c.effects.Load())
		}
	})
}

func newRetryable(transport http.RoundTripper, retryMax int) *retryablehttp.Client {
	rc := retryablehttp.NewClient()
	rc.Logger = nil
	rc.RetryWaitMin = time.Millisecond
	rc.RetryWaitMax = 5 * time.Millisecond
	rc.RetryMax = retryMax
	rc.HTTPClient = &http.Client{Transport: transport}
	return rc
}

func TestRetryableHTTP(t *testing.T) {
	type fault struct{ drop, before, after int }
	plan := []fault{{}, {drop: 1}, {after: 1}, {before: 1}, {drop: 2, after: 1}, {before: 1, after: 1, drop: 1}}
	ctx := context.Background()
	run := func(t *testing.T, s *testServer, o *orders, send func(i int) (*http.Response, error)) {
		for i, f := range plan {
			s.ln.arm(f.drop)
			s.faults.before.Add(int32(f.before))
			s.faults.after.Add(int32(f.after))
			resp, err := send(i)
			if err != nil {
				t.Fatalf("request %d %+v: %v", i, f, err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var got order
			if err := json.Unmarshal(body, &got); err != nil || resp.StatusCode != http.StatusCreated {
				t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
			}
			o.mu.Lock()
			last := o.created[len(o.created)-1]
			o.mu.Unlock()
			if got.ID != last || got.Body != fmt.Sprint("order ", i) {
				t.Fatalf("request %d: got %+v, last created %s", i, got, last)
			}
		}
		if n := o.effects.Load(); n != int64(len(plan)) {
			t.Fatalf("effects %d for %d logical requests", n, len(plan))
		}
	}
	t.Run("key set by the caller", func(t *testing.T) {
		o := &orders{}
		s := newServer(t, openEngine(t, nil), nil, o)
		rc := newRetryable(&http.Transport{DisableKeepAlives: true}, 4)
		run(t, s, o, func(i int) (*http.Response, error) {
			req, err := retryablehttp.NewRequestWithContext(ctx, http.MethodPost, s.URL+"/v1/orders", strings.NewReader(fmt.Sprint("order ", i)))
			if err != nil {
				return nil, err
			}
			req.Header.Set(idemhttp.HeaderKey, fmt.Sprint("key-", i))
			return rc.Do(req)
		})
	})
	t.Run("key pinned through the Transport", func(t *testing.T) {
		o := &orders{}
		s := newServer(t, openEngine(t, nil), nil, o)
		// The Transport makes one attempt per RoundTrip here (a deadline
		// too short for a retry), so every retry is go-retryablehttp's: the
		// key pinned in the context is the same for all of them.
		tr := &idemhttp.Transport{Base: &http.Transport{DisableKeepAlives: true}, MaxElapsedTime: time.Nanosecond}
		rc := newRetryable(tr, 4)
		run(t, s, o, func(i int) (*http.Response, error) {
			req, err := retryablehttp.NewRequestWithContext(idemhttp.WithKey(ctx, idemhttp.NewKey()), http.MethodPost, s.URL+"/v1/orders", strings.NewReader(fmt.Sprint("order ", i)))
			if err != nil {
				return nil, err
			}
			return rc.Do(req)
		})
	})
	t.Run("without a pinned key the Transport dedupes nothing across the caller's retries", func(t *testing.T) {
		o := &orders{}
		s := newServer(t, openEngine(t, nil), nil, o)
		tr := &idemhttp.Transport{Base: &http.Transport{DisableKeepAlives: true}, MaxElapsedTime: time.Nanosecond}
		rc := newRetryable(tr, 4)
		s.faults.after.Add(1)
		req, _ := retryablehttp.NewRequestWithContext(ctx, http.MethodPost, s.URL+"/v1/orders", strings.NewReader("x"))
		resp, err := rc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if o.effects.Load() != 2 {
			t.Fatalf("effects %d, want 2: each RoundTrip minted its own key", o.effects.Load())
		}
	})
}

func TestRetryableHTTPRefusals(t *testing.T) {
	ctx := context.Background()
	t.Run("409: not retried", func(t *testing.T) {
		h := newBlocking()
		s := newServer(t, openEngine(t, &idem.Options{InFlight: idem.InFlightFail}), nil, h)
		go func() {
			req, _ := http.NewRequest(http.MethodPost, s.URL, strings.NewReader("x"))
			req.Header.Set(idemhttp.HeaderKey, "busy")
			if resp, err := s.Client().Do(req); err == nil {
				resp.Body.Close()
			}
		}()
		<-h.started
		defer close(h.release)
		hits := s.faults.hits.Load()
		req, _ := retryablehttp.NewRequestWithContext(ctx, http.MethodPost, s.URL, strings.NewReader("x"))
		req.Header.Set(idemhttp.HeaderKey, "busy")
		resp, err := newRetryable(nil, 4).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusConflict || s.faults.hits.Load()-hits != 1 {
			t.Fatalf("%d after %d requests", resp.StatusCode, s.faults.hits.Load()-hits)
		}
	})
	t.Run("503: retried after Retry-After", func(t *testing.T) {
		e := openEngine(t, nil)
		e.Close()
		o := &orders{}
		s := newServer(t, e, nil, o)
		rc := newRetryable(nil, 1)
		var waits []time.Duration
		backoff := rc.Backoff
		rc.Backoff = func(min, max time.Duration, n int, resp *http.Response) time.Duration {
			d := backoff(min, max, n, resp)
			waits = append(waits, d)
			return d
		}
		req, _ := retryablehttp.NewRequestWithContext(ctx, http.MethodPost, s.URL, strings.NewReader("x"))
		req.Header.Set(idemhttp.HeaderKey, "k")
		if _, err := rc.Do(req); err == nil {
			t.Fatal("no error after the retries")
		}
		if s.faults.hits.Load() != 2 || o.effects.Load() != 0 || len(waits) != 1 || waits[0] != time.Second {
			t.Fatalf("hits %d, effects %d, waits %v", s.faults.hits.Load(), o.effects.Load(), waits)
		}
	})
}
