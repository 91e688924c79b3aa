package idemhttp

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/idemkit/idem/idemcore"
)

// Problem type URIs of the middleware's refusals (RFC 9457 problem details,
// member "type"). The IETF Idempotency-Key draft registers none, so these are
// our own; each URI resolves to the documentation of its constant. The
// status, the Stripe-shaped "error" member and what clients do are in the
// package documentation's table.
const (
	// ProblemKeyMissing: HTTP 400, a method that requires a key came without
	// an Idempotency-Key header. Stripe code "idempotency_key_missing".
	ProblemKeyMissing = "https://pkg.go.dev/github.com/idemkit/idem/idemhttp#ProblemKeyMissing"
	// ProblemKeyInvalid: HTTP 400, the header is empty, repeated, longer than
	// idemcore.MaxKeyLen bytes, has white space at either end or holds control
	// or format characters (idemcore.ValidateKey). Stripe code
	// "idempotency_key_invalid".
	ProblemKeyInvalid = "https://pkg.go.dev/github.com/idemkit/idem/idemhttp#ProblemKeyInvalid"
	// ProblemKeyMismatch: HTTP 422, the key was used with another request
	// (method, path, query or body differ): the draft's 422. Stripe code
	// "idempotency_key_mismatch".
	ProblemKeyMismatch = "https://pkg.go.dev/github.com/idemkit/idem/idemhttp#ProblemKeyMismatch"
	// ProblemInProgress: HTTP 409 with Retry-After, a request with the key
	// is running (the engine runs with idemcore.InFlightFail): the draft's 409.
	// Stripe code "idempotency_key_in_use", as Stripe's own.
	ProblemInProgress = "https://pkg.go.dev/github.com/idemkit/idem/idemhttp#ProblemInProgress"
	// ProblemIncomplete: HTTP 409 without Retry-After, the key's first
	// execution was interrupted (a crash, a panic) and the engine refuses to
	// run it again (idemcore.RecoverRefuse) until an operator resolves the key,
	// or the request waited for a first execution that ended without an
	// outcome. Stripe code "idempotency_key_incomplete".
	ProblemIncomplete = "https://pkg.go.dev/github.com/idemkit/idem/idemhttp#ProblemIncomplete"
	// ProblemBodyTooLarge: HTTP 413, the request body is over
	// Options.MaxBodySize; nothing is stored. Stripe type
	// "invalid_request_error", code "request_body_too_large".
	ProblemBodyTooLarge = "https://pkg.go.dev/github.com/idemkit/idem/idemhttp#ProblemBodyTooLarge"
	// ProblemResponseNotStored: HTTP 500, a replay of a request whose
	// response was over the size limit: the first caller got the whole
	// response, the handler does not run again, and the response cannot be
	// replayed (never a truncated one). Stripe code
	// "idempotency_response_not_stored".
	ProblemResponseNotStored = "https://pkg.go.dev/github.com/idemkit/idem/idemhttp#ProblemResponseNotStored"
	// ProblemStoreUnavailable: HTTP 503 with Retry-After, the engine could
	// not record the request (disk full, database down, file locked, engine
	// closed); the handler did not run. Stripe type "api_error", code
	// "idempotency_store_unavailable".
	ProblemStoreUnavailable = "https://pkg.go.dev/github.com/idemkit/idem/idemhttp#ProblemStoreUnavailable"
	// ProblemStoredResponseCorrupt: HTTP 500, a stored response that starts
	// as the middleware's format (its version byte) but does not decode.
	// Stored bytes that do not start so (an operator's raw resolution)
	// replay as 200 with the bytes as body instead (see the package
	// documentation). Stripe type "api_error", code
	// "idempotency_record_corrupt".
	ProblemStoredResponseCorrupt = "https://pkg.go.dev/github.com/idemkit/idem/idemhttp#ProblemStoredResponseCorrupt"
	// ProblemStoredError: HTTP 500, the key's stored outcome is an
	// *idemcore.Error (an operator resolved it with an error, or something other
	// than this middleware stored one): replayed to every retry, with
	// Idempotent-Replayed: true. Stripe type "api_error", code the stored
	// Code ("idempotency_stored_error" when it is empty), message the
	// stored Message; the problem's "detail" is the stored Message too.
	ProblemStoredError = "https://pkg.go.dev/github.com/idemkit/idem/idemhttp#ProblemStoredError"
)

// Stripe error types used in the "error" member (stripe-go's ErrorType).
const (
	stripeIdempotency    = "idempotency_error"
	stripeInvalidRequest = "invalid_request_error"
	stripeAPI            = "api_error"
	// stripeKeyInUse is the code of Stripe's in-progress 409, which
	// ProblemInProgress carries too and Transport retries.
	stripeKeyInUse = "idempotency_key_in_use"
)

// problem is one refusal: RFC 9457's members plus Stripe's error object, so
// that stripe-go parses it into a *stripe.Error and stops retrying, as it
// does against Stripe.
type problem struct {
	Type   string       `json:"type"`
	Title  string       `json:"title"`
	Status int          `json:"status"`
	Detail string       `json:"detail,omitempty"`
	Error  stripeObject `json:"error"`

	retryAfter time.Duration // Retry-After header when > 0
}

type stripeObject struct {
	Type    string `json:"type"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

func newProblem(typ string, status int, stripeType, code, title, detail string) *problem {
	msg := title
	if detail != "" {
		msg = title + ": " + detail
	}
	return &problem{Type: typ, Title: title, Status: status, Detail: detail,
		Error: stripeObject{Type: stripeType, Code: code, Message: msg}}
}

func problemKeyMissing() *problem {
	return newProblem(ProblemKeyMissing, idemcore.RefusalKeyMissing.Refusal().Status, stripeIdempotency, "idempotency_key_missing",
		"Idempotency-Key header required", "")
}

func problemKeyInvalid(detail string) *problem {
	return newProblem(ProblemKeyInvalid, idemcore.RefusalKeyInvalid.Refusal().Status, stripeIdempotency, "idempotency_key_invalid",
		"Idempotency-Key header invalid", detail)
}

func problemKeyMismatch() *problem {
	return newProblem(ProblemKeyMismatch, idemcore.RefusalConflict.Refusal().Status, stripeIdempotency, "idempotency_key_mismatch",
		"Idempotency-Key reused with another request",
		"keys for idempotent requests can only be used with the same method, path, query and body they were first used with")
}

func problemInProgress(retryAfter time.Duration) *problem {
	p := newProblem(ProblemInProgress, idemcore.RefusalInProgress.Refusal().Status, stripeIdempotency, stripeKeyInUse,
		"A request with this Idempotency-Key is in progress", "retry after the Retry-After delay")
	p.retryAfter = retryAfter
	return p
}

func problemIncomplete() *problem {
	return newProblem(ProblemIncomplete, idemcore.RefusalIncomplete.Refusal().Status, stripeIdempotency, "idempotency_key_incomplete",
		"The first request with this Idempotency-Key did not complete",
		"its outcome is unknown; an operator must resolve the key, or retry if the first request was only interrupted")
}

func problemBodyTooLarge(limit int64) *problem {
	return newProblem(ProblemBodyTooLarge, http.StatusRequestEntityTooLarge, stripeInvalidRequest, "request_body_too_large",
		"Request body too large", "the limit is "+strconv.FormatInt(limit, 10)+" bytes")
}

func problemResponseNotStored() *problem {
	return newProblem(ProblemResponseNotStored, idemcore.RefusalNotStored.Refusal().Status, stripeIdempotency, "idempotency_response_not_stored",
		"The response to this Idempotency-Key cannot be replayed",
		"the request was executed, but its response was over the size limit and was not stored")
}

func problemStoreUnavailable(retryAfter time.Duration) *problem {
	p := newProblem(ProblemStoreUnavailable, idemcore.RefusalUnavailable.Refusal().Status, stripeAPI, "idempotency_store_unavailable",
		"Idempotency store unavailable", "the request was not executed; retry after the Retry-After delay")
	p.retryAfter = retryAfter
	return p
}

func problemStoredResponseCorrupt() *problem {
	return newProblem(ProblemStoredResponseCorrupt, http.StatusInternalServerError, stripeAPI, "idempotency_record_corrupt",
		"Stored response unreadable", "")
}

func problemStoredError(e *idemcore.Error) *problem {
	code := e.Code
	if code == "" {
		code = "idempotency_stored_error"
	}
	p := newProblem(ProblemStoredError, http.StatusInternalServerError, stripeAPI, code,
		"The request with this Idempotency-Key ended with an error", e.Message)
	p.Error.Message = e.Message
	if p.Error.Message == "" {
		p.Error.Message = p.Title
	}
	return p
}

// refusalProblem is the problem of an engine refusal (idemcore.RefusalOf):
// the draft's 409 with ref's RetryAfter (a second when it has none) for in
// progress, storeRetryAfter for a store unavailable.
func refusalProblem(ref idemcore.Refusal, storeRetryAfter time.Duration) *problem {
	switch ref.Kind {
	case idemcore.RefusalKeyMissing:
		return problemKeyMissing()
	case idemcore.RefusalKeyInvalid:
		return problemKeyInvalid("not a valid idempotency key")
	case idemcore.RefusalConflict:
		return problemKeyMismatch()
	case idemcore.RefusalInProgress:
		if ref.RetryAfter <= 0 {
			ref.RetryAfter = time.Second
		}
		return problemInProgress(ref.RetryAfter)
	case idemcore.RefusalIncomplete:
		return problemIncomplete()
	case idemcore.RefusalNotStored:
		return problemResponseNotStored()
	}
	return problemStoreUnavailable(storeRetryAfter)
}

// write sends p as application/problem+json.
func (p *problem) write(w http.ResponseWriter) {
	body, _ := json.Marshal(p) // only strings and ints: cannot fail
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	if p.retryAfter > 0 {
		h.Set("Retry-After", retryAfterSeconds(p.retryAfter))
	}
	w.WriteHeader(p.Status)
	w.Write(body)
}

// retryAfterSeconds renders d as Retry-After's delay-seconds (RFC 9110
// section 10.2.3), rounded up, at least 1.
func retryAfterSeconds(d time.Duration) string {
	s := int64((d + time.Second - 1) / time.Second)
	if s < 1 {
		s = 1
	}
	return strconv.FormatInt(s, 10)
}
