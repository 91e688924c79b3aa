package bench

import (
	"context"
	"errors"
	"fmt"

	"github.com/cespare/xxhash/v2"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempg"
	"github.com/idemkit/idem/kit/benchkit"
)

// IdemPG is idem's Postgres backend (idempg) on the server at IDEM_TEST_PG,
// through a pgx pool of the same size as the naive Postgres pattern's, in a
// schema of its own, dropped on Close. The pool is the engine's own, so its
// connections get the engine's lock_timeout for the session
// (idempg.AfterConnect), as the package's documentation advises for such a
// pool.
type IdemPG struct {
	pool   *pgxpool.Pool
	dsn    string
	e      *idempg.Engine
	schema string
}

// OpenIdemPG migrates a fresh schema on the server at dsn and opens an
// idempg engine on it. It returns an error wrapping ErrSkipped when dsn is
// empty or the server does not answer.
func OpenIdemPG(ctx context.Context, dsn string) (benchkit.Deduper, error) {
	hook, err := idempg.AfterConnect(nil)
	if err != nil {
		return nil, err
	}
	pool, suffix, err := openBenchPool(ctx, dsn, "idempg", hook)
	if err != nil {
		return nil, err
	}
	p := &IdemPG{pool: pool, dsn: dsn, schema: "idem_bench_pg_" + suffix}
	opts := &idempg.Options{Schema: p.schema}
	if _, err := idempg.Migrate(ctx, pool, opts); err != nil {
		pool.Close()
		return nil, err
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+p.schema+".effects (key bytea PRIMARY KEY, value bytea NOT NULL)"); err != nil {
		_ = p.drop()
		return nil, err
	}
	p.e, err = idempg.Open(ctx, pool, opts, &idem.Options{PruneInterval: -1})
	if err != nil {
		_ = p.drop()
		return nil, err
	}
	return p, nil
}

// Name implements benchkit.Deduper.
func (p *IdemPG) Name() string { return "idempg" }

// Do calls Engine.Do.
func (p *IdemPG) Do(ctx context.Context, key string, fp []byte, fn func(context.Context) ([]byte, error)) ([]byte, bool, error) {
	res, err := p.e.Do(ctx, key, fp, fn)
	return res.Response, res.Replayed, pgErr(err)
}

// DoTx calls Engine.DoTx; fn's effect is a row of the schema's effects
// table, written in the transaction that stores the record, by the naive
// pattern's plain INSERT (idempg runs fn once per transaction: a call its
// batch rolls back to a savepoint is not run again).
func (p *IdemPG) DoTx(ctx context.Context, key string, fp []byte, fn benchkit.TxFunc) ([]byte, bool, error) {
	res, err := p.e.DoTx(ctx, key, fp, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		eff, resp, err := fn(ctx)
		if err != nil {
			return nil, err
		}
		_, err = tx.Exec(ctx, "INSERT INTO "+p.schema+".effects (key, value) VALUES ($1, $2)", eff.Key, eff.Value)
		return resp, err
	})
	return res.Response, res.Replayed, pgErr(err)
}

// Preload copies rs into idem_records (COPY FROM) as done records of
// attempt 1, each with a fencing token of its own, then moves the token
// sequence past them and analyzes the table: the rows idempg's Do would
// have stored, without a claim each.
func (p *IdemPG) Preload(ctx context.Context, rs benchkit.RecordSet) error {
	ks := benchkit.SortedKeys(rs.First, rs.N)
	done := rs.Completed.UnixNano()
	ret := int64(benchkit.Retention)
	_, err := p.pool.CopyFrom(ctx, pgx.Identifier{p.schema, "idem_records"},
		[]string{"key", "fingerprint", "state", "attempt", "fence", "started_ns", "completed_ns", "retention_ns", "expires_ns", "response"},
		pgx.CopyFromSlice(len(ks), func(j int) ([]any, error) {
			fp := int64(xxhash.Sum64(benchkit.Fingerprint(ks[j].Index)))
			return []any{ks[j].Key, fp, int16(2), int32(1), int64(rs.First + j + 1), done, done, ret, done + ret, benchkit.Response()}, nil
		}))
	if err != nil {
		return fmt.Errorf("copy: %w", err)
	}
	_, err = p.pool.Exec(ctx, `SELECT setval('`+p.schema+`.idem_fence', GREATEST((SELECT max(fence) FROM `+p.schema+`.idem_records), 1));
		ANALYZE `+p.schema+`.idem_records`)
	return err
}

// replaySpecs: a second process replays through idempg's Do in an engine of
// its own, then another with the bare SELECT of the response by key on
// idem_records, of other keys (Draw): on the same keys, the SELECT found in
// the server's cache the pages Do's process had just read, and its p50 fell
// by a sixth (bench/RESULTS.md, "Issue 21: the replay's decode").
func (p *IdemPG) replaySpecs() []childSpec {
	return []childSpec{
		{Kind: childIdemPG, DSN: p.dsn, Schema: p.schema},
		{Kind: childSelect, DSN: p.dsn, Table: p.schema + ".idem_records", Draw: 1},
	}
}

// Prune calls Engine.Prune.
func (p *IdemPG) Prune(ctx context.Context) (int, error) { return p.e.Prune(ctx) }

// DiskSize is the size of the records and effects tables with their
// indexes and TOAST data, as the server reports it (as Postgres.DiskSize).
func (p *IdemPG) DiskSize(ctx context.Context) (int64, error) {
	var n int64
	err := p.pool.QueryRow(ctx, `SELECT pg_total_relation_size($1::regclass) + pg_total_relation_size($2::regclass)`,
		p.schema+".idem_records", p.schema+".effects").Scan(&n)
	return n, err
}

// Close closes the engine, drops the schema and closes the pool.
func (p *IdemPG) Close() error {
	err := p.e.Close()
	return errors.Join(err, p.drop())
}

func (p *IdemPG) drop() error {
	defer p.pool.Close()
	_, err := p.pool.Exec(context.Background(), "DROP SCHEMA "+p.schema+" CASCADE")
	return err
}

// pgErr maps the engine's sentinels to the harness's, as benchkit's idem
// contender does.
func pgErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, idem.ErrFingerprintMismatch):
		return errors.Join(benchkit.ErrConflict, err)
	case errors.Is(err, idem.ErrInProgress):
		return errors.Join(benchkit.ErrInProgress, err)
	}
	return err
}
