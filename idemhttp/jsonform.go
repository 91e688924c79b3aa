package idemhttp

import (
	"encoding/base64"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/idemkit/idem/idemcore"
)

// The one JSON form of a record and of an outbox message, shared by the
// admin handler and the idem CLI's --json. Times are RFC 3339 in UTC.

// AdminRecord is the JSON form of a record (idemcore.Record): the answer of
// the admin handler's GET /records and POST /records/resolve, and what the
// idem CLI prints with --json (get, ls). NewAdminRecord makes it.
type AdminRecord struct {
	Key   string `json:"key"`
	State string `json:"state"` // "started" or "done"
	// Attempt counts executions of fn, from 1.
	Attempt int `json:"attempt"`
	// Fingerprint is the 16 hex digits of the fingerprint's xxhash.
	Fingerprint string     `json:"fingerprint"`
	StartedAt   time.Time  `json:"started_at"`
	CompletedAt *time.Time `json:"completed_at"` // null while started
	// ExpiresAt is when the record leaves the retention window: the longer of
	// its recorded window and the engine's Retention after it completed
	// (after it started, while started); null for never
	// (a record kept until resolved).
	ExpiresAt *time.Time `json:"expires_at"`
	// Retention is the retention window the record was written under, as a
	// Go duration (idemcore.Record.Retention); KeptUntilResolved marks an
	// interrupted execution written under idemcore.RecoverRefuse.
	Retention         string `json:"retention"`
	KeptUntilResolved bool   `json:"kept_until_resolved"`
	// Error is the stored *idemcore.Error, null if none.
	Error *AdminErrorJSON `json:"error"`
	// ResponseSize is the response's length in bytes; null when there is no
	// response, which differs from an empty one.
	ResponseSize *int `json:"response_size"`
	// Response is the response, when the answer shows it: UTF-8 text as
	// is, other bytes in base64 (ResponseEncoding says which); null when
	// there is none or it is hidden: ResponseHidden is then true, and only
	// its size is given (the admin handler without
	// AdminOptions.ShowResponses, a listing such as `idem ls`).
	Response         *string `json:"response"`
	ResponseEncoding string  `json:"response_encoding,omitempty"`
	ResponseHidden   bool    `json:"response_hidden"`
}

// AdminErrorJSON is a stored *idemcore.Error: its code and message.
type AdminErrorJSON struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// AdminMessage is the JSON form of an outbox message (idemcore.Message): the
// answer of the admin handler's GET /outbox/SEQ, an element of
// AdminMessages, and what the idem CLI prints with --json (outbox ls, outbox
// get). NewAdminMessage makes it.
type AdminMessage struct {
	Seq   uint64 `json:"seq"`
	Topic string `json:"topic"`
	// Key is the idempotency key of the call that enqueued it; Index its
	// place among that call's messages, from 0.
	Key           string `json:"key"`
	Index         int    `json:"index"`
	DownstreamKey string `json:"downstream_key"`
	OrderingKey   string `json:"ordering_key"`
	// Attempt counts the failed attempts so far.
	Attempt       int        `json:"attempt"`
	EnqueuedAt    time.Time  `json:"enqueued_at"`
	NextAttemptAt *time.Time `json:"next_attempt_at"` // null: at once, or dead
	LastError     *string    `json:"last_error"`      // null: no failed attempt
	Dead          bool       `json:"dead"`
	DeadAt        *time.Time `json:"dead_at"` // null unless dead
	// ExpiresAt is when a dead letter is deleted (idemcore.DeadLetterExpiry);
	// null unless dead.
	ExpiresAt *time.Time `json:"expires_at"`
	// PayloadSize, Payload, PayloadEncoding and PayloadHidden are as the
	// Response fields of AdminRecord.
	PayloadSize     *int    `json:"payload_size"`
	Payload         *string `json:"payload"`
	PayloadEncoding string  `json:"payload_encoding,omitempty"`
	PayloadHidden   bool    `json:"payload_hidden"`
}

// NewAdminRecord renders rec in its JSON form: expiresAt is when it leaves
// the retention window as the reader judges it (idemcore.Expiry with its
// Options.Retention; the zero time for never); show includes its response,
// else only the response's size is given, with ResponseHidden.
func NewAdminRecord(rec *idemcore.Record, expiresAt time.Time, show bool) AdminRecord {
	out := AdminRecord{
		Key:               rec.Key,
		State:             rec.State.String(),
		Attempt:           rec.Attempt,
		Fingerprint:       fmt.Sprintf("%016x", rec.Fingerprint),
		StartedAt:         rec.StartedAt.UTC(),
		CompletedAt:       timeOrNull(rec.CompletedAt),
		ExpiresAt:         timeOrNull(expiresAt),
		Retention:         rec.Retention.String(),
		KeptUntilResolved: rec.KeptUntilResolved,
	}
	if rec.Err != nil {
		out.Error = &AdminErrorJSON{Code: rec.Err.Code, Message: rec.Err.Message}
	}
	out.ResponseSize, out.Response, out.ResponseEncoding, out.ResponseHidden = userBytes(rec.Response, show)
	return out
}

// NewAdminMessage renders m in its JSON form: deadLetterRetention is the
// reader's OutboxOptions.DeadLetterRetention (0 for the message's own), for
// a dead letter's ExpiresAt; show includes its payload, else only the
// payload's size is given, with PayloadHidden.
func NewAdminMessage(m *idemcore.Message, deadLetterRetention time.Duration, show bool) AdminMessage {
	out := AdminMessage{
		Seq:           m.Seq,
		Topic:         m.Topic,
		Key:           m.Key,
		Index:         m.Index,
		DownstreamKey: m.DownstreamKey,
		OrderingKey:   m.OrderingKey,
		Attempt:       m.Failures,
		EnqueuedAt:    m.EnqueuedAt.UTC(),
		NextAttemptAt: timeOrNull(m.NextAttemptAt),
		Dead:          m.Dead,
		DeadAt:        timeOrNull(m.DeadAt),
	}
	if m.Dead {
		out.NextAttemptAt = nil
		out.ExpiresAt = timeOrNull(idemcore.DeadLetterExpiry(m, deadLetterRetention))
	}
	if m.LastError != "" {
		s := m.LastError
		out.LastError = &s
	}
	out.PayloadSize, out.Payload, out.PayloadEncoding, out.PayloadHidden = userBytes(m.Payload, show)
	return out
}

// userBytes renders stored user bytes: their size (nil: none stored, which
// differs from empty) and, if show, the bytes themselves: UTF-8 text as is,
// other bytes in base64; else hidden.
func userBytes(b []byte, show bool) (size *int, text *string, encoding string, hidden bool) {
	if b == nil {
		return nil, nil, "", false
	}
	n := len(b)
	if !show {
		return &n, nil, "", true
	}
	s, enc := string(b), "utf-8"
	if !utf8.Valid(b) {
		s, enc = base64.StdEncoding.EncodeToString(b), "base64"
	}
	return &n, &s, enc, false
}

// timeOrNull is t in UTC, nil for the zero time.
func timeOrNull(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	t = t.UTC()
	return &t
}
