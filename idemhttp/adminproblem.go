package idemhttp

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/idemkit/idem/idemcore"
)

// The admin handler's error answers.

// AdminProblem is an error answer of the admin handler: RFC 9457 problem
// details (application/problem+json). Code names the case (see Admin for the
// list and their statuses); Type is
// "https://pkg.go.dev/github.com/idemkit/idem/idemhttp#AdminProblem-" + Code
// (the Idempotency-Key draft registers no types; these are this package's);
// Title is the status's text; Detail says why; Op and Key are the engine's
// operation and key, when it named them (an idemcore.OpError).
type AdminProblem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Code   string `json:"code"`
	Op     string `json:"op,omitempty"`
	Key    string `json:"key,omitempty"`
}

// adminProblemType is the prefix of the problem type URIs: the code follows.
const adminProblemType = "https://pkg.go.dev/github.com/idemkit/idem/idemhttp#AdminProblem-"

// adminError is an error answer before it is written.
type adminError struct {
	status     int
	code       string
	detail     string
	op, key    string
	retryAfter time.Duration
}

func (e *adminError) Error() string { return e.detail }

func adminBadRequest(detail string) error {
	return &adminError{status: http.StatusBadRequest, code: "bad_request", detail: detail}
}

// adminCodes are the engine's errors the admin handler names, checked in
// order: the first that err matches gives its status and code; any other
// error is 500 "internal".
var adminCodes = []struct {
	err    error
	status int
	code   string
}{
	{idemcore.ErrInvalidKey, http.StatusBadRequest, "invalid_key"},
	{idemcore.ErrNotFound, http.StatusNotFound, "not_found"},
	{idemcore.ErrMessageNotFound, http.StatusNotFound, "message_not_found"},
	{idemcore.ErrState, http.StatusConflict, "wrong_state"},
	{idemcore.ErrInProgress, http.StatusConflict, "in_progress"}, // with Retry-After
	// A resolution over the engine's Options.MaxResponseSize.
	{idemcore.ErrResponseTooLarge, http.StatusRequestEntityTooLarge, "too_large"},
	{idemcore.ErrClosed, http.StatusServiceUnavailable, "closed"},
	{idemcore.ErrCorrupt, http.StatusInternalServerError, "corrupt"},
}

// toAdminError maps an engine error to its status and code (adminCodes).
func toAdminError(err error) *adminError {
	var ae *adminError
	if errors.As(err, &ae) {
		return ae
	}
	out := &adminError{detail: err.Error()}
	var op *idemcore.OpError
	if errors.As(err, &op) {
		out.op, out.key, out.detail = op.Op, op.Key, op.Err.Error()
	}
	out.status, out.code = http.StatusInternalServerError, "internal"
	for _, c := range adminCodes {
		if errors.Is(err, c.err) {
			out.status, out.code = c.status, c.code
			break
		}
	}
	if out.code == "in_progress" {
		out.retryAfter = time.Second
		if ip, ok := errors.AsType[*idemcore.InProgressError](err); ok {
			out.retryAfter = ip.RetryAfter
		}
	}
	return out
}

func adminWriteProblem(w http.ResponseWriter, e *adminError) {
	if e.retryAfter > 0 {
		secs := int64((e.retryAfter + time.Second - 1) / time.Second)
		w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(e.status)
	_ = json.NewEncoder(w).Encode(AdminProblem{
		Type:   adminProblemType + e.code,
		Title:  http.StatusText(e.status),
		Status: e.status,
		Detail: e.detail,
		Code:   e.code,
		Op:     e.op,
		Key:    e.key,
	})
}
