package idempg

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idemcore"
)

// rowInvariants counts the rows of idem_records that break what the table's
// CHECK constraints held until version 7 (migrations/0007_no_row_checks.sql).
const rowInvariants = `SELECT count(*) FROM {schema}.idem_records WHERE NOT (state IN (1, 2) AND attempt >= 1
	AND (state = 2 OR (owner IS NOT NULL AND lease_until IS NOT NULL))
	AND (state = 1 OR (owner IS NULL AND lease_until IS NULL)))`

// brokenRows is the number of rows of b's schema that break rowInvariants.
func brokenRows(t *testing.T, ctx context.Context, b *backend) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(ctx, b.sql(rowInvariants)).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestRowInvariants: without the table's CHECK constraints, every write of
// the backend still keeps the invariants they held, while fn runs and after:
// lone and batched claims and completions, a stored error, DoTx's claim and
// completion, a takeover of an interrupted execution, an operator's
// resolution and a prune.
func TestRowInvariants(t *testing.T) {
	ctx := context.Background()
	e := testEngine(t)
	b := e.b
	during := func(ctx context.Context) ([]byte, error) {
		if n := brokenRows(t, ctx, b); n != 0 {
			t.Errorf("while fn runs: %d rows break the invariants", n)
		}
		return []byte("ok"), nil
	}
	if _, err := e.Do(ctx, "lone", []byte("fp"), during); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Do(ctx, "failed", []byte("fp"), func(context.Context) ([]byte, error) {
		return nil, &idemcore.Error{Code: "c", Message: "m"}
	}); err == nil {
		t.Fatal("a failing fn: no error")
	}
	// A crowd, so that the claims and completions go in batches.
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Go(func() {
			if _, err := e.Do(ctx, fmt.Sprintf("crowd-%d", i), []byte("fp"), func(context.Context) ([]byte, error) {
				time.Sleep(time.Millisecond)
				return []byte("ok"), nil
			}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if _, err := e.DoTx(ctx, "tx", []byte("fp"), func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		var n int
		if err := tx.QueryRow(ctx, b.sql(rowInvariants)).Scan(&n); err != nil || n != 0 {
			t.Errorf("inside DoTx: %d rows break the invariants (%v)", n, err)
		}
		return []byte("ok"), nil
	}); err != nil {
		t.Fatal(err)
	}
	// An interrupted execution of another process, its lease lapsed: taken
	// over by the next call; and another resolved by hand.
	if _, err := b.pool.Exec(ctx, b.sql(`INSERT INTO {schema}.idem_records (key, fingerprint, state, attempt, fence, owner, lease_until,
			started_ns, retention_ns, expires_ns) VALUES
		('interrupted', $1::bigint, 1, 1, nextval('{schema}.idem_fence'), 'gone', 'epoch', {now_ns} - 1000, 3600000000000, {now_ns} + 3600000000000),
		('resolved', $1::bigint, 1, 1, nextval('{schema}.idem_fence'), 'gone', 'epoch', {now_ns} - 1000, 3600000000000, {now_ns} + 3600000000000)`),
		int64(xxhash.Sum64([]byte("fp")))); err != nil {
		t.Fatal(err)
	}
	if res, err := e.Do(ctx, "interrupted", []byte("fp"), during); err != nil || res.Attempt != 2 {
		t.Fatalf("the takeover: %+v, %v", res, err)
	}
	if err := e.Resolve("resolved", []byte("by hand"), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Prune(ctx); err != nil {
		t.Fatal(err)
	}
	var states []int
	rows, _ := b.pool.Query(ctx, b.sql(`SELECT DISTINCT state FROM {schema}.idem_records ORDER BY state`))
	for rows.Next() {
		var s int
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		states = append(states, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n := brokenRows(t, ctx, b); n != 0 || !slices.Equal(states, []int{2}) {
		t.Errorf("after the calls: %d rows break the invariants, states %v; want none, every record done", n, states)
	}
}

// TestBrokenRowIsCorrupt: a row no write of the backend makes, written by
// hand now that no CHECK constraint refuses it (a state other than 1 or 2,
// an attempt below 1), is reported as corrupt where it is read, and fn
// does not run for its key.
func TestBrokenRowIsCorrupt(t *testing.T) {
	ctx := context.Background()
	e := testEngine(t)
	b := e.b
	if _, err := b.pool.Exec(ctx, b.sql(`INSERT INTO {schema}.idem_records (key, fingerprint, state, attempt, fence, owner, lease_until,
			started_ns, completed_ns, retention_ns, expires_ns) VALUES
		('state3', 1, 3, 1, nextval('{schema}.idem_fence'), NULL, NULL, {now_ns}, {now_ns}, 3600000000000, {now_ns} + 3600000000000),
		('attempt0', 1, 2, 0, nextval('{schema}.idem_fence'), NULL, NULL, {now_ns}, {now_ns}, 3600000000000, {now_ns} + 3600000000000)`)); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"state3", "attempt0"} {
		ran := false
		_, err := e.Do(ctx, key, []byte("fp"), func(context.Context) ([]byte, error) { ran = true; return nil, nil })
		if !errors.Is(err, idemcore.ErrCorrupt) || ran {
			t.Errorf("Do of %s: %v (fn ran: %v), want ErrCorrupt and fn not run", key, err, ran)
		}
		if _, err := e.Get(key); !errors.Is(err, idemcore.ErrCorrupt) {
			t.Errorf("Get of %s: %v, want ErrCorrupt", key, err)
		}
	}
}

// TestMigrateFromVersion6: a schema at version 6, with a done record and an
// interrupted execution in it, is refused at Open until Migrate applies
// version 7, which drops idem_records' CHECK constraints and keeps every
// row: the done record replays and the interrupted execution is taken over.
func TestMigrateFromVersion6(t *testing.T) {
	ctx := context.Background()
	pool, s, above := schemaAt(t, 6)
	fp := int64(xxhash.Sum64([]byte("fp")))
	if _, err := pool.Exec(ctx, s.sql(`INSERT INTO {schema}.idem_records (key, fingerprint, state, attempt, fence, owner, lease_until,
			started_ns, completed_ns, retention_ns, kept_until_resolved, expires_ns, response, has_error, error_code, error_message) VALUES
		('done', $1::bigint, 2, 1, nextval('{schema}.idem_fence'), NULL, NULL, $2::bigint, $2::bigint, $3::bigint, false, $2::bigint + $3::bigint, 'v6', false, '', ''),
		('started', $1::bigint, 1, 1, nextval('{schema}.idem_fence'), 'a v6 process', 'epoch', $2::bigint, 0, $3::bigint, false, $2::bigint + $3::bigint, NULL, false, '', '')`),
		fp, time.Now().Add(-time.Minute).UnixNano(), int64(24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	checks := func() int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_constraint WHERE conrelid = ($1::text)::regclass AND contype = 'c'`,
			s.schema+".idem_records").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := checks(); n != 4 {
		t.Fatalf("version 6 has %d CHECK constraints on idem_records, want 4", n)
	}
	if _, err := Open(ctx, pool, &s.Options, nil); !errors.Is(err, ErrSchemaVersion) {
		t.Fatalf("Open of a version 6 schema: %v, want ErrSchemaVersion", err)
	}
	did, err := Migrate(ctx, pool, &s.Options)
	if err != nil || !slices.Equal(did, above) || !slices.Contains(did, 7) {
		t.Fatalf("Migrate from version 6: %v, %v; want %v", did, err, above)
	}
	if n := checks(); n != 0 {
		t.Errorf("after version 7: %d CHECK constraints on idem_records, want none", n)
	}
	e, err := Open(ctx, pool, &s.Options, &idemcore.Options{PruneInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	res, err := e.Do(ctx, "done", []byte("fp"), func(context.Context) ([]byte, error) { return nil, errors.New("ran again") })
	if err != nil || !res.Replayed || string(res.Response) != "v6" {
		t.Errorf("the done record after the migration: %+v, %v; want v6's response replayed", res, err)
	}
	res, err = e.Do(ctx, "started", []byte("fp"), func(context.Context) ([]byte, error) { return []byte("recovered"), nil })
	if err != nil || res.Attempt != 2 || string(res.Response) != "recovered" {
		t.Errorf("the interrupted execution after the migration: %+v, %v; want attempt 2", res, err)
	}
}
