package idempg

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idempg/internal/pgtest"
)

// TestApplyFailedVersionRollsBack applies a version whose SQL fails halfway:
// neither its first statement nor its row in idem_migrations remains.
func TestApplyFailedVersionRollsBack(t *testing.T) {
	pool := pgtest.Pool(t, pgtest.Env)
	s, err := resolve(&Options{Schema: pgtest.Schema(t, pool)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := Migrate(ctx, pool, &s.Options); err != nil {
		t.Fatal(err)
	}
	bad := migration{version: SchemaVersion + 1, name: "bad", sql: `CREATE TABLE {schema}.half (x int); SELECT 1/0;`}
	_, err = apply(ctx, pool, s, bad)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "22012" {
		t.Fatalf("apply of a failing version: %v, want division_by_zero", err)
	}
	var half, row bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, s.Schema+".half").Scan(&half); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, s.sql(`SELECT EXISTS (SELECT 1 FROM {schema}.idem_migrations WHERE version = $1)`), bad.version).Scan(&row); err != nil {
		t.Fatal(err)
	}
	if half || row {
		t.Errorf("after the failed version: table %v, version row %v; want neither", half, row)
	}
	if err := checkVersion(ctx, pool, s); err != nil {
		t.Errorf("checkVersion after the failed version: %v", err)
	}
}

// TestMigrateFromVersion3: a schema at version 3 (times by each engine's
// clock) with records, an outbox message and a dead letter in it is
// refused at Open until Migrate applies version 4 (the database's clock),
// which keeps every row as it was: the done record replays, the interrupted
// execution is recovered, the messages are listed with their times, and the
// time columns say whose clock they hold.
func TestMigrateFromVersion3(t *testing.T) {
	ctx := context.Background()
	pool, s, _ := schemaAt(t, 3)
	// Rows as a build at version 3 wrote them, a minute ago by its clock.
	at := time.Now().Add(-time.Minute).UnixNano()
	fp := int64(xxhash.Sum64([]byte("fp")))
	day := int64(24 * time.Hour)
	for _, st := range []struct {
		q    string
		args []any
	}{
		{`INSERT INTO {schema}.idem_records (key, fingerprint, state, attempt, fence, owner, lease_until, started_ns, completed_ns,
			retention_ns, kept_until_resolved, expires_ns, response, has_error, error_code, error_message)
		VALUES ('done', $1::bigint, 2, 1, nextval('{schema}.idem_fence'), NULL, NULL, $2::bigint, $2::bigint, $3::bigint, false, $2::bigint + $3::bigint, 'v3', true, 'code', 'message'),
			('started', $1::bigint, 1, 1, nextval('{schema}.idem_fence'), 'a v3 process', 'epoch', $2::bigint, 0, $3::bigint, false, $2::bigint + $3::bigint, NULL, false, '', '')`,
			[]any{fp, at, day}},
		{`INSERT INTO {schema}.idem_outbox (key, idx, ordering_key, topic, payload, attempt, last_error, enqueued_ns, next_attempt_ns)
		VALUES ('done', 0, 'done', 't', 'pending', 1, 'no', $1::bigint, $1::bigint + $2::bigint)`,
			[]any{at, int64(time.Hour)}},
		{`INSERT INTO {schema}.idem_dead_letters (seq, key, idx, ordering_key, topic, payload, attempt, last_error, enqueued_ns, dead_ns, retention_ns, expires_ns)
		VALUES (1000, 'done', 1, 'done', 't', 'dead', 5, 'gone', $1::bigint, $1::bigint, $2::bigint, $1::bigint + $2::bigint)`,
			[]any{at, day}},
	} {
		if _, err := pool.Exec(ctx, s.sql(st.q), st.args...); err != nil {
			t.Fatal(err)
		}
	}

	if _, err := Open(ctx, pool, &s.Options, nil); !errors.Is(err, ErrSchemaVersion) {
		t.Fatalf("Open of a version 3 schema: %v, want ErrSchemaVersion", err)
	}
	did, err := Migrate(ctx, pool, &s.Options)
	var above []int
	for _, m := range migrations[3:] {
		above = append(above, m.version)
	}
	if err != nil || !slices.Equal(did, above) {
		t.Fatalf("Migrate from version 3: %v, %v; want %v", did, err, above)
	}
	e, err := Open(ctx, pool, &s.Options, &idemcore.Options{PruneInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	res, err := e.Do(ctx, "done", []byte("fp"), func(context.Context) ([]byte, error) { return nil, errors.New("ran again") })
	var stored *idemcore.Error
	if !errors.As(err, &stored) || stored.Code != "code" || !res.Replayed || string(res.Response) != "v3" || res.CompletedAt.UnixNano() != at {
		t.Errorf("the done record after the migration: %+v, %v; want v3's outcome replayed, its times kept", res, err)
	}
	res, err = e.Do(ctx, "started", []byte("fp"), func(ctx context.Context) ([]byte, error) {
		if c, _ := idemcore.CallFrom(ctx); !c.Recovered || c.Attempt != 2 {
			t.Errorf("the interrupted execution after the migration ran as %+v, want attempt 2, recovered", c)
		}
		return []byte("recovered"), nil
	})
	if err != nil || res.Attempt != 2 {
		t.Errorf("the interrupted execution after the migration: %+v, %v", res, err)
	}
	var pending, dead *idemcore.Message
	if err := e.Messages(func(m *idemcore.Message, err error) error {
		switch {
		case err != nil:
			return err
		case m.Dead:
			dead = m
		default:
			pending = m
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if pending == nil || pending.EnqueuedAt.UnixNano() != at || pending.NextAttemptAt.UnixNano() != at+int64(time.Hour) ||
		dead == nil || dead.Seq != 1000 || dead.DeadAt.UnixNano() != at {
		t.Errorf("the messages after the migration: pending %+v, dead %+v; want both, their times kept", pending, dead)
	}
	var comment *string
	if err := pool.QueryRow(ctx, `SELECT col_description(($1::text)::regclass, attnum) FROM pg_attribute
		WHERE attrelid = ($1::text)::regclass AND attname = 'completed_ns'`, s.schema+".idem_records").Scan(&comment); err != nil {
		t.Fatal(err)
	}
	if comment == nil || !strings.Contains(*comment, "database's clock") {
		t.Errorf("idem_records.completed_ns says %v, want whose clock it holds", comment)
	}
}

// schemaAt makes a schema of its own with the migrations up to version
// applied, as a build of that version left it, and returns the pool, its
// settings and the versions above it that Migrate has yet to apply.
func schemaAt(t *testing.T, version int) (*pgxpool.Pool, *settings, []int) {
	t.Helper()
	pool := pgtest.Pool(t, pgtest.Env)
	s, err := resolve(&Options{Schema: pgtest.Schema(t, pool)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+s.schema+"; "+s.sql(migrationsTable)); err != nil {
		t.Fatal(err)
	}
	var above []int
	for _, m := range migrations {
		if m.version > version {
			above = append(above, m.version)
			continue
		}
		if _, err := apply(ctx, pool, s, m); err != nil {
			t.Fatalf("version %d: %v", m.version, err)
		}
	}
	return pool, s, above
}
