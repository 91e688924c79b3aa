package idempg

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idemcore"
)

// TestBreakerStartedRowWithoutLease: version 7 also dropped the CHECK that
// a started row has an owner and a lease (migrations/0007_no_row_checks.sql),
// so a started row broken by hand may now have neither. Such a row is as
// corrupt as one of state 3: Do and DoTx of its key should fail with
// ErrCorrupt (not a driver's scan error), without running fn, as
// TestBrokenRowIsCorrupt has it for the state and attempt columns.
func TestBreakerStartedRowWithoutLease(t *testing.T) {
	ctx := context.Background()
	e := testEngine(t)
	b := e.b
	if _, err := b.pool.Exec(ctx, b.sql(`INSERT INTO {schema}.idem_records (key, fingerprint, state, attempt, fence, owner, lease_until,
			started_ns, completed_ns, retention_ns, expires_ns) VALUES
		('no-owner', $1::bigint, 1, 1, nextval('{schema}.idem_fence'), NULL, now() + interval '1 hour', {now_ns}, 0, 3600000000000, {now_ns} + 3600000000000),
		('no-lease', $1::bigint, 1, 1, nextval('{schema}.idem_fence'), 'other', NULL, {now_ns}, 0, 3600000000000, {now_ns} + 3600000000000),
		('neither', $1::bigint, 1, 1, nextval('{schema}.idem_fence'), NULL, NULL, {now_ns}, 0, 3600000000000, {now_ns} + 3600000000000)`), int64(xxhash.Sum64([]byte("fp")))); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"no-owner", "no-lease", "neither"} {
		for _, viaTx := range []bool{false, true} {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			ran := false
			var err error
			if viaTx {
				_, err = e.DoTx(cctx, key, []byte("fp"), func(context.Context, pgx.Tx) ([]byte, error) { ran = true; return nil, nil })
			} else {
				_, err = e.Do(cctx, key, []byte("fp"), func(context.Context) ([]byte, error) { ran = true; return nil, nil })
			}
			cancel()
			if !errors.Is(err, idemcore.ErrCorrupt) || ran {
				t.Errorf("DoTx %v of %s: %v (fn ran: %v), want ErrCorrupt and fn not run", viaTx, key, err, ran)
			}
		}
	}
}
