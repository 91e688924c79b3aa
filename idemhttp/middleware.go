package idemhttp

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/idemkit/idem/idemcore"
)

// Header names the middleware reads and writes.
const (
	// HeaderKey is the request header that carries the idempotency key (IETF
	// draft-ietf-httpapi-idempotency-key-header, revision 07, section 2).
	HeaderKey = "Idempotency-Key"
	// HeaderReplayed is set to "true" on every replayed response, as Stripe
	// does; a first answer never carries it.
	HeaderReplayed = "Idempotent-Replayed"
	// HeaderRetention advertises the retention window on every response to a
	// request with a key: delta-seconds (like Retry-After), how long after it
	// completes a request is replayed (idemcore.Doer.Retention, rounded down).
	// The draft defines no such header; the name is ours.
	HeaderRetention = "Idempotency-Retention"
)

// Defaults for the zero values of Options.
const (
	// DefaultMaxBodySize is the largest request body read, in bytes (1 MiB):
	// a larger one is refused with 413 and nothing is stored.
	DefaultMaxBodySize = 1 << 20
	// DefaultMaxResponseSize is the largest response body stored, in bytes
	// (1 MiB - 64 KiB, so that the stored record, headers included, fits the
	// engine's own default limit idemcore.DefaultMaxResponseSize).
	DefaultMaxResponseSize = 1<<20 - 64<<10
	// DefaultStoreRetryAfter is the Retry-After of a 503 when the store
	// fails.
	DefaultStoreRetryAfter = time.Second
	// maxRetryableRounds bounds how often a request that waited for a first
	// execution marked NotStored tries the key again before it answers 409.
	maxRetryableRounds = 3
	// scopeNamespace is the namespace of stored keys when Options.Scope is
	// set (see StoredKey).
	scopeNamespace = "idemhttp"
)

// defaultHeaders are the response headers stored and replayed when
// Options.Headers is nil.
var defaultHeaders = []string{
	"Cache-Control", "Content-Disposition", "Content-Encoding", "Content-Language",
	"Content-Location", "Content-Type", "ETag", "Expires", "Last-Modified", "Link",
	"Location", "Vary",
}

// neverStored are headers no configuration stores: they belong to one
// response (Set-Cookie, Date), are computed (Content-Length) or are
// hop-by-hop (RFC 9110 section 7.6.1), or the middleware sets them.
var neverStored = map[string]bool{
	"Set-Cookie": true, "Date": true, "Content-Length": true, "Transfer-Encoding": true,
	"Connection": true, "Keep-Alive": true, "Trailer": true, "Upgrade": true,
	"Proxy-Connection": true, HeaderReplayed: true, HeaderRetention: true,
}

// Options configure Middleware. A nil *Options means all defaults; the zero
// value of every field means its default.
type Options struct {
	// Methods are the methods the middleware applies to; requests with other
	// methods pass through untouched. Nil means POST and PATCH (GET, HEAD,
	// PUT, DELETE and OPTIONS are idempotent by definition, RFC 9110 section
	// 9.2.2, as the draft notes).
	Methods []string

	// Optional lets requests without an Idempotency-Key header through to
	// the handler, unprotected. False (the default) refuses them: 400
	// ProblemKeyMissing.
	Optional bool

	// Scope returns the principal a request belongs to (the authenticated
	// user or tenant); it is combined into the stored key (StoredKey), so two
	// principals' equal keys never meet. Nil means ONE PRINCIPAL FOR ALL
	// CALLERS: a key sent by one client is replayed to any other client that
	// sends it, with the first client's response. Set Scope on every API with
	// more than one user, and put the middleware after authentication (a 401
	// or 403 is never stored). An empty scope is a principal of its own.
	Scope func(*http.Request) string

	// MaxBodySize is the largest request body, in bytes, read into the
	// fingerprint and handed to the handler. Zero means DefaultMaxBodySize.
	// A larger body gets 413 ProblemBodyTooLarge; the handler does not run
	// and nothing is stored.
	MaxBodySize int64

	// MaxResponseSize is the largest response body, in bytes, buffered and
	// stored, its trailers (names and values) counted with it. Zero means
	// DefaultMaxResponseSize. A handler that writes more is streamed to its
	// caller from then on (the first caller gets the whole response, and
	// so does it when only the trailers pass the limit) and the response is
	// not stored: the key is done, the handler does not run again, and
	// replays get 500 ProblemResponseNotStored, never a truncated body. The
	// engine's own limit (idemcore.Options.MaxResponseSize) applies to the
	// stored record, status and headers included, with the same outcome.
	MaxResponseSize int

	// Headers are the response headers stored and replayed, beside the
	// status and body. Nil means Cache-Control, Content-Disposition,
	// Content-Encoding, Content-Language, Content-Location, Content-Type,
	// ETag, Expires, Last-Modified, Link, Location and Vary. Set-Cookie,
	// Date, Content-Length, hop-by-hop headers and the middleware's own are
	// never stored: Middleware panics if the list names one. The first
	// caller gets every header the handler set before it wrote the status,
	// as from net/http. Trailers are stored whatever the list says (see
	// the package documentation).
	Headers []string

	// StoreRetryAfter is the Retry-After, wall-clock, of a 503 when the
	// store fails (rounded up to whole seconds). Zero means
	// DefaultStoreRetryAfter.
	StoreRetryAfter time.Duration

	// RunUnprotected runs the handler without idempotency when the store
	// fails before the handler began, instead of answering 503: duplicates
	// then execute again. An explicit opt-in for APIs that prefer
	// availability to at-most-once.
	RunUnprotected bool

	// Logger receives store failures at warn level, without keys or bodies.
	// Nil discards.
	Logger *slog.Logger
}

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

// StoredKey is the key the middleware stores a request under when
// Options.Scope is set: idemcore.KeyOf("idemhttp", scope, key), the namespace
// "idemhttp", ":" and a SHA-256 of the scope and the client's key (so
// neither sits in the file in clear, and no two (scope, key) pairs meet).
// Operators compute it to find a client's key with Get, Forget or Resolve.
// Without Scope the stored key is the client's key itself.
func StoredKey(scope, key string) string { return idemcore.KeyOf(scopeNamespace, scope, key) }

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

// parseKey reads the Idempotency-Key header fields. It returns "" and no
// problem when there is none.
func parseKey(values []string) (string, *problem) {
	switch len(values) {
	case 0:
		return "", nil
	case 1:
	default:
		return "", problemKeyInvalid("the header appears more than once")
	}
	v := strings.Trim(values[0], " \t")
	if s, ok := parseSFString(v); ok {
		v = s
	}
	switch {
	case strings.TrimSpace(v) == "":
		return "", problemKeyInvalid("the key is empty")
	case len(v) > idemcore.MaxKeyLen:
		return "", problemKeyInvalid(fmt.Sprintf("the key is longer than %d bytes", idemcore.MaxKeyLen))
	case !utf8.ValidString(v):
		return "", problemKeyInvalid("the key is not valid UTF-8")
	case strings.IndexFunc(v, func(r rune) bool { return r < 0x20 || r == 0x7f }) >= 0:
		return "", problemKeyInvalid("the key holds control characters")
	}
	// The engine's rules (white space at an end, format characters), also
	// when Scope stores a hash of the key, which the engine cannot check.
	if err := idemcore.ValidateKey(v); err != nil {
		return "", problemKeyInvalid(strings.TrimPrefix(err.Error(), idemcore.ErrInvalidKey.Error()+": "))
	}
	return v, nil
}

// parseSFString parses v as a Structured Field String (RFC 8941 section
// 3.3.3): DQUOTE, printable ASCII with `"` and `\` escaped by `\`, DQUOTE,
// nothing after. It reports false for anything else, parameters included.
func parseSFString(v string) (string, bool) {
	if len(v) < 2 || v[0] != '"' {
		return "", false
	}
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i >= len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", false
			}
			b.WriteByte(v[i])
		case c == '"':
			if i != len(v)-1 {
				return "", false
			}
			return b.String(), true
		case c < 0x20 || c > 0x7e:
			return "", false
		default:
			b.WriteByte(c)
		}
	}
	return "", false // no closing quote
}

// readBody reads r's body, at most limit bytes.
func readBody(r *http.Request, limit int64) (body []byte, tooLarge bool, err error) {
	if r.ContentLength > limit {
		return nil, true, nil
	}
	if r.Body == nil || r.Body == http.NoBody {
		return []byte{}, false, nil
	}
	body, err = io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return nil, false, err
	}
	if int64(len(body)) > limit {
		return nil, true, nil
	}
	return body, false, nil
}

// withBody returns a shallow copy of r whose body reads body.
func withBody(r *http.Request, body []byte) *http.Request {
	r2 := *r
	r2.Body = io.NopCloser(bytes.NewReader(body))
	r2.ContentLength = int64(len(body))
	r2.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	return &r2
}

// fingerprint is what defines "the same request": the method, the escaped
// path, the raw query and the raw body, each prefixed with its length. The
// scope is in the key, not here; headers are not part of it.
func fingerprint(r *http.Request, body []byte) []byte {
	parts := [...][]byte{[]byte(r.Method), []byte(r.URL.EscapedPath()), []byte(r.URL.RawQuery), body}
	n := 0
	for _, p := range parts {
		n += binary.MaxVarintLen64 + len(p)
	}
	fp := make([]byte, 0, n)
	for _, p := range parts {
		fp = binary.AppendUvarint(fp, uint64(len(p)))
		fp = append(fp, p...)
	}
	return fp
}

// Where a call stands, for callContext.
const (
	callWaiting int32 = iota // fn has not started: the request's end ends the call
	callStarted              // fn started: the call outlives the request
	callLeft                 // the request ended before fn started
)

// callContext is the context the middleware calls Do with: reqCtx's values,
// no deadline, and reqCtx's end only until fn starts, so that a waiting
// duplicate whose client goes away stops waiting while a handler whose
// client goes away runs on, its outcome recorded for the retry (fn's
// context, a child of this one, is the handler's: it ends when the engine
// closes or the lease is lost, never with the client). fn calls begin
// first: false if the request has ended, and then fn must not run the
// handler (its context is ending). One atomic state decides between the two,
// so there is no instant at which both could win. release frees the context
// after Do returns.
func callContext(reqCtx context.Context) (ctx context.Context, begin func() bool, release func()) {
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(reqCtx))
	var state atomic.Int32
	left := func() {
		if state.CompareAndSwap(callWaiting, callLeft) {
			cancel(context.Cause(reqCtx))
		}
	}
	stop := context.AfterFunc(reqCtx, left)
	begin = func() bool {
		if reqCtx.Err() != nil { // ended, its AfterFunc maybe not run yet
			left()
		}
		return state.CompareAndSwap(callWaiting, callStarted)
	}
	return ctx, begin, func() { stop(); cancel(nil) }
}
