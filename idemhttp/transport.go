package idemhttp

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Defaults for the zero values of Transport's fields.
const (
	// DefaultMaxElapsedTime bounds one logical request, its retries and
	// their waits included.
	DefaultMaxElapsedTime = time.Minute
	// DefaultInitialInterval is the first backoff wait.
	DefaultInitialInterval = 100 * time.Millisecond
	// DefaultMaxInterval caps one backoff wait (a Retry-After is honoured up
	// to the deadline).
	DefaultMaxInterval = 10 * time.Second
	// DefaultMaxBodyBuffer is the largest request body, in bytes, buffered
	// to be sent again when the request has no GetBody.
	DefaultMaxBodyBuffer = 1 << 20
)

// Transport is an http.RoundTripper that gives each logical request one
// idempotency key and retries it until it gets an answer, so that a server
// behind Middleware (or Stripe, or any server that honours the
// Idempotency-Key header) executes it once:
//
//	client := &http.Client{Transport: &idemhttp.Transport{}}
//
// For the methods it applies to (Methods), RoundTrip
//   - takes the key from the request's Idempotency-Key header if it has one
//     (kept as is), else from the context (WithKey), else mints one: 128
//     random bits, base64url, sent as a Structured Field String (`"…"`,
//     draft revision 07);
//   - sends the request, and on a timeout, a connection reset, refused or
//     closed before the response (a net.Error, io.EOF, ECONNRESET,
//     ECONNREFUSED, EPIPE), the 409 that says a request with the key is in
//     progress (Middleware's ProblemInProgress, Stripe's
//     idempotency_key_in_use), or a 429, 502, 503 or 504 that is not a
//     replay, sends it again with the same key,
//     after an exponential backoff with jitter (cenkalti/backoff/v5,
//     randomization 0.5) or the response's Retry-After (delay-seconds or an
//     HTTP date) when it has one and it is at least InitialInterval (a
//     Retry-After of 0, or a date already past, gets the backoff instead);
//   - stops when an answer comes that is not retried (a replay,
//     Idempotent-Replayed: true, is a stored answer and final, whatever its
//     status and Retry-After; so is any other 409, the handler's own), when
//     the request's
//     context ends (its error is returned), or when the next wait would pass
//     MaxElapsedTime after the first attempt: then the last response is
//     returned (its body unread), or the last error.
//
// Each attempt is a clone of the request with a fresh body: from GetBody
// (which http.NewRequest sets for in-memory bodies) or, without GetBody, from
// a buffer of at most MaxBodyBuffer bytes; a larger body without GetBody is
// sent once, without retries. The request itself is not modified. Other
// methods go to Base unchanged, once.
//
// A RoundTripper sees physical calls: a caller that retries by itself (a loop
// around client.Do, stripe-go, go-retryablehttp) must pin the key with
// WithKey, or set the header, or each of its tries gets a new key and nothing
// is deduplicated across them. Per-attempt timeouts belong to Base
// (http.Transport's ResponseHeaderTimeout); http.Client.Timeout bounds the
// whole logical request. The zero value is ready to use; a Transport is safe
// for concurrent use and must not be changed while in use.
type Transport struct {
	// Base sends each attempt. Nil means http.DefaultTransport.
	Base http.RoundTripper
	// Methods are the methods given a key and retried. Nil means POST and
	// PATCH.
	Methods []string
	// MaxElapsedTime bounds a logical request, wall-clock. Zero means
	// DefaultMaxElapsedTime.
	MaxElapsedTime time.Duration
	// InitialInterval is the first backoff wait. Zero means
	// DefaultInitialInterval.
	InitialInterval time.Duration
	// MaxInterval caps a backoff wait. Zero means DefaultMaxInterval.
	MaxInterval time.Duration
	// MaxBodyBuffer is the largest body, in bytes, buffered for retries of a
	// request without GetBody. Zero means DefaultMaxBodyBuffer.
	MaxBodyBuffer int64
}

type keyCtxKey struct{}

// WithKey returns a context that pins key as the idempotency key of the
// requests made with it (through Transport), so that a caller's own retry
// loop sends the same key each time. key is sent as a Structured Field
// String when it is printable ASCII, raw otherwise.
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyCtxKey{}, key)
}

// NewKey returns a new idempotency key: 128 random bits, base64url without
// padding (22 characters), as Transport mints them.
func NewKey() string {
	var b [16]byte
	rand.Read(b[:]) // never fails (crypto/rand, Go 1.24+)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// RoundTrip implements http.RoundTripper; see Transport.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	if !t.applies(req.Method) {
		return base.RoundTrip(req)
	}
	key := req.Header.Get(HeaderKey)
	if key == "" {
		k, ok := req.Context().Value(keyCtxKey{}).(string)
		if !ok || k == "" {
			k = NewKey()
		}
		key = headerValue(k)
	}

	body, retryable, err := t.bodies(req)
	if err != nil {
		return nil, err
	}
	ctx := req.Context()
	initial := or(t.InitialInterval, DefaultInitialInterval)
	attempt := func() (*http.Response, error) {
		r := req.Clone(ctx)
		r.Header.Set(HeaderKey, key)
		b, err := body()
		if err != nil {
			return nil, backoff.Permanent(err)
		}
		r.Body = b
		resp, err := base.RoundTrip(r)
		if err != nil {
			if !retryable || ctx.Err() != nil || !transient(err) {
				return nil, backoff.Permanent(err)
			}
			return nil, err
		}
		if !retryable || !retryStatus(resp) {
			return resp, nil
		}
		rerr := error(&statusError{resp.StatusCode})
		// A Retry-After shorter than the first backoff wait (0, a date
		// already past) gives way to the backoff: honoured, it would send
		// the attempts one after another without a pause.
		if d, ok := retryAfter(resp.Header.Get("Retry-After"), time.Now()); ok && d >= initial {
			rerr = &backoff.RetryAfterError{Duration: d}
		}
		return resp, rerr
	}

	b := backoff.NewExponentialBackOff()
	b.InitialInterval = initial
	b.MaxInterval = or(t.MaxInterval, DefaultMaxInterval)
	var last *http.Response
	resp, err := backoff.Retry(ctx, func() (*http.Response, error) {
		if last != nil {
			drain(last)
			last = nil
		}
		resp, err := attempt()
		last = resp
		return resp, err
	}, backoff.WithBackOff(b), backoff.WithMaxElapsedTime(or(t.MaxElapsedTime, DefaultMaxElapsedTime)))
	if resp != nil {
		if ctx.Err() != nil && err != nil {
			drain(resp)
			return nil, err
		}
		return resp, nil // an answer, or the last one retries did not improve
	}
	return nil, err
}

func (t *Transport) applies(method string) bool {
	if t.Methods == nil {
		return method == http.MethodPost || method == http.MethodPatch
	}
	for _, m := range t.Methods {
		if m == method {
			return true
		}
	}
	return false
}

// bodies returns the source of each attempt's body, and whether the request
// may be sent more than once.
func (t *Transport) bodies(req *http.Request) (func() (io.ReadCloser, error), bool, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return func() (io.ReadCloser, error) { return http.NoBody, nil }, true, nil
	}
	if req.GetBody != nil {
		first := req.Body
		return func() (io.ReadCloser, error) {
			if first != nil {
				b := first
				first = nil
				return b, nil
			}
			return req.GetBody()
		}, true, nil
	}
	limit := t.MaxBodyBuffer
	if limit <= 0 {
		limit = DefaultMaxBodyBuffer
	}
	buf, err := io.ReadAll(io.LimitReader(req.Body, limit+1))
	if err != nil {
		req.Body.Close()
		return nil, false, fmt.Errorf("idemhttp: read request body: %w", err)
	}
	if int64(len(buf)) > limit {
		// Too large to buffer: sent once, what was read first.
		rest := req.Body
		used := false
		return func() (io.ReadCloser, error) {
			if used {
				return nil, errors.New("idemhttp: request body too large to send again")
			}
			used = true
			return struct {
				io.Reader
				io.Closer
			}{io.MultiReader(bytes.NewReader(buf), rest), rest}, nil
		}, false, nil
	}
	req.Body.Close()
	return func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf)), nil }, true, nil
}

// headerValue renders key for the Idempotency-Key header: a Structured
// Field String when it can be one, the raw key otherwise.
func headerValue(key string) string {
	for i := 0; i < len(key); i++ {
		if key[i] < 0x20 || key[i] > 0x7e {
			return key
		}
	}
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`)
	return `"` + r.Replace(key) + `"`
}

func (e *statusError) Error() string { return "idemhttp: retryable status " + strconv.Itoa(e.status) }
