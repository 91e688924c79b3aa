package idemhttp

import (
	"log/slog"
	"net/http"
	"time"
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
