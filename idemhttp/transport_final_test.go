package idemhttp_test

// Answers that can never change are not retried: behind Middleware a
// handler's own answer is stored and replayed, so resending the request
// gets the same bytes again. The Transport retries only the in-progress 409
// and 429 or 5xx answers that were not replayed. Each test counts the
// attempts that reached the server; none measures time.

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-retryablehttp"
	"github.com/stripe/stripe-go/v82"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
)

// answering is a handler that counts its executions and answers each with
// status, the headers and body.
type answering struct {
	runs   atomic.Int64
	status int
	header http.Header
	body   string
}

func (a *answering) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	a.runs.Add(1)
	for k, vs := range a.header {
		w.Header()[k] = vs
	}
	w.WriteHeader(a.status)
	io.WriteString(w, a.body)
}

// storedHeaders are Options.Headers with Retry-After, so a handler's
// Retry-After is replayed too.
var storedHeaders = []string{"Content-Type", "Retry-After"}

// transportPost sends one logical POST with key through a fastTransport.
func transportPost(t *testing.T, url, key string) *http.Response {
	t.Helper()
	req, _ := http.NewRequestWithContext(idemhttp.WithKey(context.Background(), key), http.MethodPost, url, strings.NewReader("x"))
	resp, err := (&http.Client{Transport: fastTransport()}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

func TestTransportFinalAnswers(t *testing.T) {
	tests := []struct {
		name   string
		status int
		header http.Header
		// first: attempts of the first logical request (a replay ends
		// the retries of a 429 or 5xx the handler answered).
		first int32
	}{
		{"handler's 409", http.StatusConflict, http.Header{"Content-Type": {"application/json"}}, 1},
		{"handler's 409 problem", http.StatusConflict, http.Header{"Content-Type": {"application/problem+json"}}, 1},
		{"handler's 503 with Retry-After", http.StatusServiceUnavailable, http.Header{"Retry-After": {"1"}}, 2},
		{"handler's 503", http.StatusServiceUnavailable, nil, 2},
		{"handler's 429", http.StatusTooManyRequests, nil, 2},
		{"handler's 502", http.StatusBadGateway, nil, 2},
		{"handler's 500", http.StatusInternalServerError, nil, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := &answering{status: tt.status, header: tt.header, body: `{"error":"email already registered"}`}
			s := newServer(t, openEngine(t, nil), &idemhttp.Options{Headers: storedHeaders}, h)
			if tt.header.Get("Retry-After") != "" {
				// A Retry-After of 1 s would make the first request's
				// retry wait: store the answer with a plain client.
				resp, _ := mustPost(t, noKeepAlive(), s.URL, "k", "x")
				if resp.StatusCode != tt.status || resp.Header.Get(idemhttp.HeaderReplayed) != "" {
					t.Fatalf("first answer %d, replayed %q", resp.StatusCode, resp.Header.Get(idemhttp.HeaderReplayed))
				}
			} else {
				resp := transportPost(t, s.URL, "k")
				if got := s.faults.hits.Load(); resp.StatusCode != tt.status || got != tt.first {
					t.Fatalf("first logical request: %d after %d attempts, want %d after %d", resp.StatusCode, got, tt.status, tt.first)
				}
			}
			hits := s.faults.hits.Load()
			resp := transportPost(t, s.URL, "k")
			if got := s.faults.hits.Load() - hits; resp.StatusCode != tt.status || got != 1 {
				t.Fatalf("replay: %d after %d attempts, want %d after 1", resp.StatusCode, got, tt.status)
			}
			if resp.Header.Get(idemhttp.HeaderReplayed) != "true" || resp.Header.Get("Retry-After") != tt.header.Get("Retry-After") {
				t.Fatalf("replay: replayed %q, Retry-After %q", resp.Header.Get(idemhttp.HeaderReplayed), resp.Header.Get("Retry-After"))
			}
			if h.runs.Load() != 1 {
				t.Fatalf("the handler ran %d times", h.runs.Load())
			}
		})
	}
}

// TestTransportRetriesWhatCanChange: a 429 or 5xx that was not stored (the
// handler's NotStored, a gateway's) changes on a retry, and so does the
// in-progress 409 of another server (Stripe's idempotency_key_in_use, sent
// as application/json).
func TestTransportRetriesWhatCanChange(t *testing.T) {
	t.Run("NotStored 503", func(t *testing.T) {
		var runs atomic.Int64
		s := newServer(t, openEngine(t, nil), nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if runs.Add(1) <= 2 {
				idemhttp.NotStored(w)
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			w.WriteHeader(http.StatusCreated)
		}))
		resp := transportPost(t, s.URL, "k")
		if resp.StatusCode != http.StatusCreated || s.faults.hits.Load() != 3 || resp.Header.Get(idemhttp.HeaderReplayed) != "" {
			t.Fatalf("%d after %d attempts, replayed %q", resp.StatusCode, s.faults.hits.Load(), resp.Header.Get(idemhttp.HeaderReplayed))
		}
	})
	t.Run("Stripe's idempotency_key_in_use", func(t *testing.T) {
		var hits atomic.Int64
		url := httptestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if hits.Add(1) <= 2 {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusConflict)
				io.WriteString(w, `{"error":{"type":"idempotency_error","code":"idempotency_key_in_use","message":"There is currently another in-progress request using this Idempotent Key"}}`)
				return
			}
			w.WriteHeader(http.StatusOK)
		}))
		resp := transportPost(t, url, "k")
		if resp.StatusCode != http.StatusOK || hits.Load() != 3 {
			t.Fatalf("%d after %d attempts", resp.StatusCode, hits.Load())
		}
	})
	t.Run("other server's 409", func(t *testing.T) {
		var hits atomic.Int64
		url := httptestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			hits.Add(1)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusConflict)
			io.WriteString(w, `{"error":{"type":"invalid_request_error","code":"resource_already_exists"}}`)
		}))
		resp := transportPost(t, url, "k")
		if resp.StatusCode != http.StatusConflict || hits.Load() != 1 {
			t.Fatalf("%d after %d attempts", resp.StatusCode, hits.Load())
		}
	})
}

// stripeVia is newStripe with tr under stripe-go's HTTP client.
func stripeVia(t *testing.T, url string, tr http.RoundTripper) *stripe.Client {
	t.Helper()
	be := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:           stripe.String(url),
		HTTPClient:    &http.Client{Transport: tr},
		LeveledLogger: &stripe.LeveledLogger{Level: stripe.LevelNull},
	}).(*stripe.BackendImplementation)
	be.SetNetworkRetriesSleep(false)
	return stripe.NewClient("sk_test_idemhttp", stripe.WithBackends(&stripe.Backends{API: be, Connect: be, Uploads: be, MeterEvents: be}))
}

func TestStripeGoOverTransport(t *testing.T) {
	ctx := context.Background()
	t.Run("the handler's 409 is final", func(t *testing.T) {
		h := &answering{status: http.StatusConflict, header: http.Header{"Content-Type": {"application/json"}},
			body: `{"error":{"type":"invalid_request_error","code":"resource_already_exists","message":"email already registered"}}`}
		s := newServer(t, openEngine(t, nil), nil, h)
		sc := stripeVia(t, s.URL, fastTransport())
		for i := range 2 {
			hits := s.faults.hits.Load()
			_, err := sc.V1Customers.Create(ctx, &stripe.CustomerCreateParams{Email: stripe.String("a@example.com")})
			stripeError(t, err, http.StatusConflict, stripe.ErrorTypeInvalidRequest, "resource_already_exists")
			if n := s.faults.hits.Load() - hits; n != 1 {
				t.Fatalf("call %d: %d attempts, want 1", i, n)
			}
		}
		if h.runs.Load() != 2 { // stripe-go mints a key per call
			t.Fatalf("the handler ran %d times", h.runs.Load())
		}
	})
	t.Run("a replayed 503 is final", func(t *testing.T) {
		h := &answering{status: http.StatusServiceUnavailable, header: http.Header{"Content-Type": {"application/json"}, "Retry-After": {"1"}},
			body: `{"error":{"type":"api_error","code":"upstream_down","message":"the bank is down"}}`}
		s := newServer(t, openEngine(t, nil), &idemhttp.Options{Headers: storedHeaders}, h)
		mustPost(t, noKeepAlive(), s.URL+"/v1/customers", "k", "email=a%40example.com")
		hits := s.faults.hits.Load()
		p := &stripe.CustomerCreateParams{Email: stripe.String("a@example.com")}
		p.SetIdempotencyKey("k")
		_, err := stripeVia(t, s.URL, fastTransport()).V1Customers.Create(ctx, p)
		stripeError(t, err, http.StatusServiceUnavailable, stripe.ErrorTypeAPI, "upstream_down")
		if n := s.faults.hits.Load() - hits; n != 1 || h.runs.Load() != 1 {
			t.Fatalf("%d attempts, %d runs, want 1 and 1", n, h.runs.Load())
		}
	})
	t.Run("the in-progress 409 is retried", func(t *testing.T) {
		c := &customers{hold: make(chan struct{}), entered: make(chan struct{}, 1)}
		s := newServer(t, openEngine(t, &idem.Options{InFlight: idem.InFlightFail}), nil, c)
		p := func() *stripe.CustomerCreateParams {
			p := &stripe.CustomerCreateParams{Email: stripe.String("a@example.com")}
			p.SetIdempotencyKey("busy")
			return p
		}
		first := make(chan error, 1)
		go func() {
			_, err := newStripe(t, s.URL).V1Customers.Create(ctx, p())
			first <- err
		}()
		<-c.entered
		type answer struct {
			cus *stripe.Customer
			err error
		}
		second := make(chan answer, 1)
		go func() {
			cus, err := stripeVia(t, s.URL, fastTransport()).V1Customers.Create(ctx, p())
			second <- answer{cus, err}
		}()
		for s.faults.hits.Load() < 2 { // the duplicate got its 409 (Retry-After: 1)
			time.Sleep(time.Millisecond)
		}
		close(c.hold)
		if err := <-first; err != nil {
			t.Fatal(err)
		}
		a := <-second
		if a.err != nil || a.cus.ID != "cus_1" || a.cus.LastResponse.Header.Get(idemhttp.HeaderReplayed) != "true" || c.effects.Load() != 1 {
			t.Fatalf("after the 409: %v %+v, effects %d", a.err, a.cus, c.effects.Load())
		}
	})
}

func TestRetryableHTTPOverTransport(t *testing.T) {
	ctx := context.Background()
	// send returns the answer, or nil when go-retryablehttp gave up.
	send := func(t *testing.T, url string, retryMax int) *http.Response {
		t.Helper()
		req, err := retryablehttp.NewRequestWithContext(idemhttp.WithKey(ctx, "k"), http.MethodPost, url, strings.NewReader("x"))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := newRetryable(fastTransport(), retryMax).Do(req)
		if err != nil {
			return nil
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	t.Run("the handler's 409 is final", func(t *testing.T) {
		h := &answering{status: http.StatusConflict, body: "email already registered"}
		s := newServer(t, openEngine(t, nil), nil, h)
		if resp := send(t, s.URL, 4); resp == nil || resp.StatusCode != http.StatusConflict || s.faults.hits.Load() != 1 {
			t.Fatalf("%v after %d attempts, want 409 after 1", resp, s.faults.hits.Load())
		}
	})
	t.Run("a replayed 503: one attempt per try of go-retryablehttp", func(t *testing.T) {
		// go-retryablehttp retries any 503, a replay too (its own policy,
		// RetryMax times); the Transport under it adds no attempt.
		h := &answering{status: http.StatusServiceUnavailable, header: http.Header{"Retry-After": {"0"}}}
		s := newServer(t, openEngine(t, nil), &idemhttp.Options{Headers: storedHeaders}, h)
		mustPost(t, noKeepAlive(), s.URL, "k", "x")
		hits := s.faults.hits.Load()
		if resp := send(t, s.URL, 2); resp != nil {
			t.Fatalf("go-retryablehttp returned %d, want it to give up", resp.StatusCode)
		}
		if n := s.faults.hits.Load() - hits; n != 3 || h.runs.Load() != 1 {
			t.Fatalf("%d attempts, %d runs, want 3 and 1", n, h.runs.Load())
		}
	})
}
