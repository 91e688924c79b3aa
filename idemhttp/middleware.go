package idemhttp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/textproto"
	"strconv"
	"time"

	"github.com/idemkit/idem/idemcore"
)

// Middleware returns the Idempotency-Key middleware over d, any engine (the
// bbolt *idem.Engine, or another backend's). Wrap the handlers that have
// effects, after authentication:
//
//	srv.Handler = idemhttp.Middleware(engine, nil)(mux)
//
// For the methods it applies to (Options.Methods), a request is answered as
// the package documentation's table says: the first request with a key runs
// the handler and its status, headers (Options.Headers) and body are stored;
// a later request with the same key, method, path, query and body gets the
// stored response with Idempotent-Replayed: true and the handler does not
// run. The key is the header's sf-string value (draft revision 07: `"abc"`)
// or, when it is not a valid sf-string, the header's raw value (stripe-go
// sends unquoted keys), so `"abc"` and `abc` are the same key.
//
// The handler runs with fn's context (idemcore.Doer.Do): it keeps the request's
// values but has no deadline and does not end when the client goes away
// once the handler has started (so that its outcome is recorded for the
// client's retry); it ends when the engine closes, whether the client is
// there or not, and, on a backend with leases (idempg), the moment the lease
// has passed unrenewed (cause idemcore.ErrLeaseLost; the engine's Caveats say
// what remains). An answer written after it ended goes to its caller but is
// not stored (the key stays started, for the engine's recovery policy).
// idemcore.CallFrom on it tells the attempt and whether the call recovers an
// interrupted one. The handler
// may mark its response as not to be stored with NotStored. A handler that
// panics leaves the key started (the engine's recovery policy decides what a
// retry does) and the panic propagates to net/http, which drops the
// connection.
//
// The handler's http.ResponseWriter buffers: Flush (and
// http.ResponseController's) does nothing until the response passes
// Options.MaxResponseSize, and it cannot be hijacked, nor unwrapped by
// http.ResponseController (whose deadlines and EnableFullDuplex then return
// http.ErrNotSupported), since a response written around it could not be
// replayed. It sends the header as it stood when the status was written,
// and trailers (declared in the Trailer header, or set through
// http.TrailerPrefix) after the body, to the first caller and every
// replay, as net/http's writer does.
//
// Concurrent duplicates follow the engine's in-flight policy: under
// idemcore.InFlightWait (the default) they wait and get the replay, under
// idemcore.InFlightFail they get 409 with Retry-After.
//
// Middleware panics if opts.Headers names a header that is never stored.
func Middleware(d idemcore.Doer, opts *Options) func(http.Handler) http.Handler {
	var o Options
	if opts != nil {
		o = *opts
	}
	m := &middleware{d: d, opts: o, methods: map[string]bool{}}
	methods := o.Methods
	if methods == nil {
		methods = []string{http.MethodPost, http.MethodPatch}
	}
	for _, meth := range methods {
		m.methods[meth] = true
	}
	headers := o.Headers
	if headers == nil {
		headers = defaultHeaders
	}
	for _, h := range headers {
		h = textproto.CanonicalMIMEHeaderKey(h)
		if neverStored[h] {
			panic(fmt.Sprintf("idemhttp: header %s is never stored", h))
		}
		m.headers = append(m.headers, h)
	}
	if m.opts.MaxBodySize <= 0 {
		m.opts.MaxBodySize = DefaultMaxBodySize
	}
	if m.opts.MaxResponseSize <= 0 {
		m.opts.MaxResponseSize = DefaultMaxResponseSize
	}
	if m.opts.StoreRetryAfter <= 0 {
		m.opts.StoreRetryAfter = DefaultStoreRetryAfter
	}
	if m.opts.Logger == nil {
		m.opts.Logger = slog.New(slog.DiscardHandler)
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(w, r, next) })
	}
}

type middleware struct {
	d       idemcore.Doer
	opts    Options
	methods map[string]bool
	headers []string // canonical names
}

func (m *middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if !m.methods[r.Method] {
		next.ServeHTTP(w, r)
		return
	}
	key, p := parseKey(r.Header.Values(HeaderKey))
	if p != nil {
		p.write(w)
		return
	}
	if key == "" {
		if m.opts.Optional {
			next.ServeHTTP(w, r)
			return
		}
		problemKeyMissing().write(w)
		return
	}
	w.Header().Set(HeaderRetention, strconv.FormatInt(int64(m.d.Retention()/time.Second), 10))

	body, tooLarge, err := readBody(r, m.opts.MaxBodySize)
	if tooLarge {
		problemBodyTooLarge(m.opts.MaxBodySize).write(w)
		return
	}
	if err != nil {
		// The client stopped sending: nobody may be listening any more.
		http.Error(w, "request body unreadable", http.StatusBadRequest)
		return
	}
	stored := key
	if m.opts.Scope != nil {
		stored = StoredKey(m.opts.Scope(r), key)
	}
	fp := fingerprint(r, body)

	var rec *recorder // set when the handler ran in this request
	for round := 0; ; round++ {
		call, begin, release := callContext(r.Context())
		res, err := m.d.Do(call, stored, fp, func(ctx context.Context) ([]byte, error) {
			if !begin() {
				// The client went away as fn was starting: the handler does
				// not run, and the key is free again.
				return nil, idemcore.Retryable(context.Cause(r.Context()))
			}
			// The handler gets fn's own context: it ends when the engine
			// closes and, on a backend with leases, the moment the lease
			// has passed (cause idemcore.ErrLeaseLost).
			rec = newRecorder(w, m.opts.MaxResponseSize)
			next.ServeHTTP(rec, withBody(r.WithContext(ctx), body))
			resp, err := rec.outcome(m.headers)
			if err == nil && ctx.Err() != nil {
				// The engine is closing, or the lease was lost: an answer
				// made under cancellation is not the request's outcome. The
				// key stays started, for the recovery policy.
				return nil, context.Cause(ctx)
			}
			return resp, err
		})
		release()
		if rec != nil {
			// The handler ran for this request: its caller gets its answer,
			// whatever became of the record (not stored, over the size
			// limit, a failed commit that leaves the key to recovery).
			rec.finish()
			if err != nil && !errors.Is(err, idemcore.ErrRetryable) && !errors.Is(err, idemcore.ErrResponseTooLarge) {
				m.opts.Logger.Warn("idemhttp: the handler ran but its outcome was not recorded", "err", errorClass(err))
			}
			return
		}
		if err == nil {
			if werr := replay(w, res.Response); werr != nil {
				problemStoredResponseCorrupt().write(w)
			}
			return
		}
		ref, refused := idemcore.RefusalOf(err)
		var se *idemcore.Error
		switch {
		case errors.Is(err, idemcore.ErrRetryable) && round+1 < maxRetryableRounds:
			continue // the call waited for was not stored: the key is free
		case refused && ref.Kind != idemcore.RefusalUnavailable:
			refusalProblem(ref, m.opts.StoreRetryAfter).write(w)
		case errors.As(err, &se):
			// A stored error (an operator's resolution, or another writer's).
			w.Header().Set(HeaderReplayed, "true")
			problemStoredError(se).write(w)
		case r.Context().Err() != nil:
			// The client went away while waiting; nothing ran.
			problemStoreUnavailable(m.opts.StoreRetryAfter).write(w)
		default:
			m.opts.Logger.Warn("idemhttp: store failed", "err", errorClass(err), "unprotected", m.opts.RunUnprotected)
			if m.opts.RunUnprotected {
				next.ServeHTTP(w, withBody(r, body))
				return
			}
			problemStoreUnavailable(m.opts.StoreRetryAfter).write(w)
		}
		return
	}
}

// errorClass is what may be logged of a store error: the engine's errors
// name the key, which is user data, so only the innermost cause's text is
// kept.
func errorClass(err error) string {
	var op *idemcore.OpError
	for errors.As(err, &op) {
		err = op.Err
	}
	return err.Error()
}
