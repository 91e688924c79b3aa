package idempg

import (
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idemcore"
)

// Outbox columns, in the order scanMessage reads them.
const outboxColumns = `seq, key, idx, ordering_key, topic, payload, attempt, last_error, enqueued_ns, next_attempt_ns, trace`

// Dead letter columns, in the order scanDead reads them.
const deadColumns = `seq, key, idx, ordering_key, topic, payload, attempt, last_error, enqueued_ns, dead_ns, retention_ns, trace`

func scanMessage(row pgx.Row) (*idemcore.Message, error) { return scanMessageAnd(row) }

// scanMessageAnd scans the outbox columns of row, then its further columns
// into extra.
func scanMessageAnd(row pgx.Row, extra ...any) (*idemcore.Message, error) {
	var (
		m             idemcore.Message
		seq, enq, nxt int64
		lastErr       []byte // bytea: any bytes (migration 3)
	)
	if err := row.Scan(append([]any{&seq, &m.Key, &m.Index, &m.OrderingKey, &m.Topic, &m.Payload, &m.Failures, &lastErr, &enq, &nxt, &m.Trace}, extra...)...); err != nil {
		return nil, err
	}
	m.LastError = string(lastErr)
	m.Seq, m.EnqueuedAt, m.NextAttemptAt = uint64(seq), fromNs(enq), fromNs(nxt)
	return &m, nil
}

func scanDead(row pgx.Row) (*idemcore.Message, error) {
	var (
		m                   idemcore.Message
		seq, enq, dead, ret int64
		lastErr             []byte // bytea: any bytes (migration 3)
	)
	if err := row.Scan(&seq, &m.Key, &m.Index, &m.OrderingKey, &m.Topic, &m.Payload, &m.Failures, &lastErr, &enq, &dead, &ret, &m.Trace); err != nil {
		return nil, err
	}
	m.LastError = string(lastErr)
	m.Seq, m.EnqueuedAt, m.DeadAt, m.DeadLetterRetention, m.Dead = uint64(seq), fromNs(enq), fromNs(dead), time.Duration(ret), true
	return &m, nil
}

// traceBytes is a trace context for its bytea column: NULL if none, and if
// over idemcore.MaxMessageTrace bytes (the column's CHECK refuses it; the
// engine never gives one).
func traceBytes(b []byte) []byte {
	if len(b) == 0 || len(b) > idemcore.MaxMessageTrace {
		return nil
	}
	return b
}

// errBytes is a last error for its bytea column: never NULL, any bytes.
func errBytes(s string) []byte { return append([]byte{}, s...) }
