package idempg

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemkit/idem/idemcore"
)

// Record columns, in the order scanned.dest reads them: the columns of an
// idemcore.Record and no more (the fencing token, the owner and the lease
// are read by the statements that judge them: Owner, the claims), so that
// a replay decodes what it answers with.
const recordColumns = `key, ` + recordValues

// recordValues are recordColumns without the key, for a lookup by key
// (scanned.values).
const recordValues = `fingerprint, state, attempt, started_ns, completed_ns,
	retention_ns, kept_until_resolved, response, has_error, error_code, error_message`

// scanned is one record row as read.
type scanned struct {
	rec         idemcore.Record
	hasError    bool
	code, msg   []byte // bytea: any bytes (migration 3)
	fp          int64
	state       int16 // smallint; a plain type, which pgx decodes without reflection
	startedNs   int64
	completedNs int64
	retentionNs int64
}

// dest are the destinations of recordColumns.
func (r *scanned) dest() []any { return append([]any{&r.rec.Key}, r.values()...) }

// values are the destinations of recordValues.
func (r *scanned) values() []any {
	return []any{&r.fp, &r.state, &r.rec.Attempt, &r.startedNs, &r.completedNs, &r.retentionNs,
		&r.rec.KeptUntilResolved, &r.rec.Response, &r.hasError, &r.code, &r.msg}
}

// record finishes r's Record, or returns an error wrapping ErrCorrupt for
// a row no claim or completion writes: a state other than started (1) or
// done (2), or an attempt below 1 (the table's CHECK constraints said so
// until version 7, migrations/0007_no_row_checks.sql).
func (r *scanned) record() (*idemcore.Record, error) {
	rec := r.rec
	rec.Fingerprint = uint64(r.fp)
	if r.state != int16(idemcore.StateStarted) && r.state != int16(idemcore.StateDone) {
		return &idemcore.Record{Key: rec.Key}, fmt.Errorf("%w: key %q: state %d", idemcore.ErrCorrupt, rec.Key, r.state)
	}
	if rec.Attempt < 1 {
		return &idemcore.Record{Key: rec.Key}, fmt.Errorf("%w: key %q: attempt %d", idemcore.ErrCorrupt, rec.Key, rec.Attempt)
	}
	rec.State = idemcore.State(r.state)
	rec.StartedAt = fromNs(r.startedNs)
	rec.CompletedAt = fromNs(r.completedNs)
	rec.Retention = time.Duration(r.retentionNs)
	if r.hasError {
		rec.Err = &idemcore.Error{Code: string(r.code), Message: string(r.msg), Replayed: true} // a stored error is a replay's
	}
	return &rec, nil
}

// toNs and fromNs convert times to the bigint columns: the zero time is 0.
func toNs(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromNs(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// expiresNs is the end of r's own retention window (idemcore.Expiry), Unix
// ns; 0 for never.
func expiresNs(r *idemcore.Record) int64 { return toNs(idemcore.Expiry(r, 0)) }

// errFields are the stored error columns of r: bytea, never NULL, so that
// a code or message of any bytes (NUL, invalid UTF-8) is stored exactly.
func errFields(r *idemcore.Record) (has bool, code, msg []byte) {
	if r.Err == nil {
		return false, []byte{}, []byte{}
	}
	return true, append([]byte{}, r.Err.Code...), append([]byte{}, r.Err.Message...)
}

// storable reports whether key can be stored in a text column: valid UTF-8
// without NUL. Any other key (an operator's call for a key of the old rules)
// has no record here.
func storable(key string) bool { return utf8.ValidString(key) && strings.IndexByte(key, 0) < 0 }
