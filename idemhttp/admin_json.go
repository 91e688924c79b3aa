package idemhttp

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/idemkit/idem/idemcore"
)

// The JSON documents of the admin handler (see Admin), exported so that a Go
// client (the idem CLI's --url) decodes them. Times are RFC 3339 in UTC;
// a null time is "none" as each field says.

// AdminIndex is the answer of GET /.
type AdminIndex struct {
	// Retention is the retention window as a Go duration ("24h0m0s"), and
	// RetentionSeconds the same in seconds.
	Retention        string  `json:"retention"`
	RetentionSeconds float64 `json:"retention_seconds"`
	// ShowResponses tells whether answers carry stored responses and
	// payloads (AdminOptions.ShowResponses).
	ShowResponses bool `json:"show_responses"`
}

// AdminStats is the answer of GET /stats: idemcore.Stats.
type AdminStats struct {
	// Retention is the retention window as a Go duration.
	Retention string `json:"retention"`
	// FileSize is the bytes of the file in use by bbolt's pages; 0 for an
	// Operator that is not a FileScanner (see it for what else it counts).
	FileSize int64 `json:"file_size"`
	// Records counts the records by state (idemcore.Stats).
	Records struct {
		Started        int `json:"started"`
		Done           int `json:"done"`
		ExpiredPending int `json:"expired_pending"`
		Corrupt        int `json:"corrupt"`
	} `json:"records"`
	// SinceOpen counts the engine's work since it was opened.
	SinceOpen struct {
		Pruned     uint64 `json:"pruned"`
		Replays    uint64 `json:"replays"`
		Executions uint64 `json:"executions"`
		Conflicts  uint64 `json:"conflicts"`
		Commits    uint64 `json:"commits"`
		Writes     uint64 `json:"writes"`
	} `json:"since_open"`
	// Outbox counts the outbox messages (idemcore.OutboxStats); Retrying and
	// Waiting are among Pending, Delivered counts since Open.
	Outbox struct {
		Pending   int    `json:"pending"`
		Retrying  int    `json:"retrying"`
		Waiting   int    `json:"waiting"`
		Dead      int    `json:"dead"`
		Corrupt   int    `json:"corrupt"`
		Delivered uint64 `json:"delivered"`
	} `json:"outbox"`
}

// newAdminStats is the one place that reads idemcore.FileStats and idemcore.Stats.
func newAdminStats(fs idemcore.FileStats, s idemcore.Stats, retention time.Duration) AdminStats {
	var out AdminStats
	out.Retention = retention.String()
	out.FileSize = fs.FileSize
	out.Records.Started, out.Records.Done = fs.Started, fs.Done
	out.Records.ExpiredPending, out.Records.Corrupt = fs.ExpiredPending, fs.Corrupt
	out.SinceOpen.Pruned, out.SinceOpen.Replays = s.Pruned, s.Replays
	out.SinceOpen.Executions, out.SinceOpen.Conflicts = s.Executions, s.Conflicts
	out.SinceOpen.Commits, out.SinceOpen.Writes = s.Commits, s.Writes
	o := fs.Outbox
	out.Outbox.Pending, out.Outbox.Retrying, out.Outbox.Waiting = o.Pending, o.Retrying, o.Waiting
	out.Outbox.Dead, out.Outbox.Corrupt, out.Outbox.Delivered = o.Dead, o.Corrupt, o.Delivered
	return out
}

// AdminMessages is the answer of GET /outbox: the messages that pass the
// filter (pending in enqueue order, then dead letters by Seq), at most limit
// of them; Matched counts all that pass it. Corrupt lists the messages that
// fail to decode (in the state asked for, whatever the topic).
type AdminMessages struct {
	Messages []AdminMessage `json:"messages"`
	Matched  int            `json:"matched"`
	Corrupt  []AdminCorrupt `json:"corrupt"`
}

// AdminCorrupt names a message that fails to decode.
type AdminCorrupt struct {
	Seq  uint64 `json:"seq"`
	Dead bool   `json:"dead"`
}

// adminForgotten is the answer of DELETE /records.
type adminForgotten struct {
	Key       string `json:"key"`
	Forgotten bool   `json:"forgotten"`
}

// adminDeadOp is the answer of retry and drop.
type adminDeadOp struct {
	Op  string `json:"op"` // "retry" or "drop"
	Seq uint64 `json:"seq"`
}

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

// toAdminError maps an engine error to its status and code.
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
	var ip *idemcore.InProgressError
	switch {
	case errors.Is(err, idemcore.ErrInvalidKey):
		out.status, out.code = http.StatusBadRequest, "invalid_key"
	case errors.Is(err, idemcore.ErrNotFound):
		out.status, out.code = http.StatusNotFound, "not_found"
	case errors.Is(err, idemcore.ErrMessageNotFound):
		out.status, out.code = http.StatusNotFound, "message_not_found"
	case errors.Is(err, idemcore.ErrState):
		out.status, out.code = http.StatusConflict, "wrong_state"
	case errors.Is(err, idemcore.ErrInProgress):
		out.status, out.code, out.retryAfter = http.StatusConflict, "in_progress", time.Second
		if errors.As(err, &ip) {
			out.retryAfter = ip.RetryAfter
		}
	case errors.Is(err, idemcore.ErrResponseTooLarge):
		// A resolution over the engine's Options.MaxResponseSize.
		out.status, out.code = http.StatusRequestEntityTooLarge, "too_large"
	case errors.Is(err, idemcore.ErrClosed):
		out.status, out.code = http.StatusServiceUnavailable, "closed"
	case errors.Is(err, idemcore.ErrCorrupt):
		out.status, out.code = http.StatusInternalServerError, "corrupt"
	default:
		out.status, out.code = http.StatusInternalServerError, "internal"
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

func adminWriteJSON(w http.ResponseWriter, status int, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
	return nil
}
