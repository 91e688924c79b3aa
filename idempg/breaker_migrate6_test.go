package idempg

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idempg/internal/pgtest"
)

// TestBreakerMigrateFromVersion6ManyRowsConcurrently: a version 6 schema
// with 20000 done records and 2000 interrupted executions, migrated by four
// processes at once (pools of their own): version 7 is applied exactly
// once, no Migrate fails, every row stays, and the records replay or are
// taken over afterwards.
func TestBreakerMigrateFromVersion6ManyRowsConcurrently(t *testing.T) {
	ctx := context.Background()
	pool, s, above := schemaAt(t, 6)
	fp := int64(xxhash.Sum64([]byte("fp")))
	now := time.Now().Add(-time.Minute).UnixNano()
	if _, err := pool.Exec(ctx, s.sql(`INSERT INTO {schema}.idem_records (key, fingerprint, state, attempt, fence, owner, lease_until,
			started_ns, completed_ns, retention_ns, kept_until_resolved, expires_ns, response, has_error, error_code, error_message)
		SELECT 'done-' || i, $1::bigint, 2, 1, nextval('{schema}.idem_fence'), NULL, NULL, $2::bigint, $2::bigint, $3::bigint, false,
			$2::bigint + $3::bigint, convert_to('v6 ' || i, 'UTF8'), false, '', '' FROM generate_series(1, 20000) AS i`), fp, now, int64(24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, s.sql(`INSERT INTO {schema}.idem_records (key, fingerprint, state, attempt, fence, owner, lease_until,
			started_ns, completed_ns, retention_ns, kept_until_resolved, expires_ns, response, has_error, error_code, error_message)
		SELECT 'started-' || i, $1::bigint, 1, 1, nextval('{schema}.idem_fence'), 'a v6 process', 'epoch', $2::bigint, 0, $3::bigint, false,
			$2::bigint + $3::bigint, NULL, false, '', '' FROM generate_series(1, 2000) AS i`), fp, now, int64(24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	const procs = 4
	dids := make([][]int, procs)
	errs := make([]error, procs)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range procs {
		p := pgtest.Pool(t, pgtest.Env)
		wg.Go(func() {
			<-start
			dids[i], errs[i] = Migrate(ctx, p, &s.Options)
		})
	}
	close(start)
	wg.Wait()
	applied := 0
	for i := range procs {
		if errs[i] != nil {
			t.Errorf("Migrate %d: %v", i, errs[i])
		}
		if slices.Contains(dids[i], 7) {
			applied++
		}
	}
	if applied != 1 {
		t.Errorf("version 7 applied by %d of the Migrates (%v), want one (above 6: %v)", applied, dids, above)
	}
	var n int
	if err := pool.QueryRow(ctx, s.sql(`SELECT count(*) FROM {schema}.idem_records`)).Scan(&n); err != nil || n != 22000 {
		t.Fatalf("rows after the migration: %d, %v; want 22000", n, err)
	}
	e, err := Open(ctx, pool, &s.Options, &idemcore.Options{PruneInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for _, k := range []string{"done-1", "done-12345", "done-20000"} {
		res, err := e.Do(ctx, k, []byte("fp"), func(context.Context) ([]byte, error) { return nil, errors.New("ran again") })
		if err != nil || !res.Replayed || string(res.Response) != "v6 "+k[len("done-"):] {
			t.Errorf("%s after the migration: %+v, %v", k, res, err)
		}
	}
	res, err := e.Do(ctx, "started-77", []byte("fp"), func(context.Context) ([]byte, error) { return []byte("recovered"), nil })
	if err != nil || res.Attempt != 2 || string(res.Response) != "recovered" {
		t.Errorf("an interrupted execution after the migration: %+v, %v", res, err)
	}
}
