package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/kit/benchkit"
)

// PostgresEnv names the environment variable that holds the DSN of the
// PostgreSQL server to measure, for example
// postgres://postgres@127.0.0.1:54329/postgres?sslmode=disable (what
// ../scripts/postgres.sh start prints).
const PostgresEnv = "IDEM_TEST_PG"

// postgresPoolSize is the number of connections: enough for PostgreSQL's
// group commit to gather many commits per WAL flush at 64 callers and more,
// few enough not to thrash two cores with backends.
const postgresPoolSize = 64

// Postgres is the common SQL dedupe pattern in PostgreSQL through a pgx pool: the
// same statements as SQLite (a SELECT first, INSERT … ON CONFLICT to claim,
// UPDATE to done), with the server's defaults: fsync and synchronous_commit
// on. Each instance works in a schema of its own, dropped on Close.
type Postgres struct {
	pool   *pgxpool.Pool
	dsn    string
	schema string

	lookup, claim, done, release, effect, prune string
}

// OpenPostgres connects to the server at dsn and creates a fresh schema. It
// returns an error wrapping ErrSkipped when dsn is empty or the server does
// not answer.
func OpenPostgres(ctx context.Context, dsn string) (benchkit.Deduper, error) {
	pool, suffix, err := openBenchPool(ctx, dsn, "postgres", nil)
	if err != nil {
		return nil, err
	}
	p := &Postgres{pool: pool, dsn: dsn, schema: "idem_bench_" + suffix}
	t := func(name string) string { return p.schema + "." + name }
	ddl := fmt.Sprintf(`
CREATE SCHEMA %[1]s;
CREATE TABLE %[2]s (
	key        text PRIMARY KEY,
	fp         bytea NOT NULL,
	state      smallint NOT NULL, -- 0 started, 1 done
	response   bytea,
	expires_at bigint NOT NULL    -- Unix nanoseconds
);
CREATE INDEX ON %[2]s (expires_at);
CREATE TABLE %[3]s (
	key   text PRIMARY KEY,
	value bytea NOT NULL
);`, p.schema, t("records"), t("effects"))
	if _, err := pool.Exec(ctx, ddl); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: schema: %w", err)
	}
	r := t("records")
	p.lookup = `SELECT fp, state, response FROM ` + r + ` WHERE key = $1 AND expires_at > $2`
	p.claim = `INSERT INTO ` + r + ` AS r (key, fp, state, expires_at) VALUES ($1, $2, 0, $3)
		ON CONFLICT (key) DO UPDATE SET fp = excluded.fp, state = 0, response = NULL, expires_at = excluded.expires_at
		WHERE r.expires_at <= $4`
	p.done = `UPDATE ` + r + ` SET state = 1, response = $1, expires_at = $2 WHERE key = $3`
	p.release = `DELETE FROM ` + r + ` WHERE key = $1 AND state = 0`
	p.effect = `INSERT INTO ` + t("effects") + ` (key, value) VALUES ($1, $2)`
	p.prune = `DELETE FROM ` + r + ` WHERE key IN (SELECT key FROM ` + r + ` WHERE expires_at <= $1 LIMIT 1000)`
	return p, nil
}

// Name implements benchkit.Deduper.
func (p *Postgres) Name() string { return "postgres" }

// replaySpecs: a second process replays with the bare SELECT of the
// response by key on the records table.
func (p *Postgres) replaySpecs() []childSpec {
	return []childSpec{{Kind: childSelect, DSN: p.dsn, Table: p.schema + ".records"}}
}

// Close drops the schema and closes the pool.
func (p *Postgres) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := p.pool.Exec(ctx, `DROP SCHEMA `+p.schema+` CASCADE`)
	p.pool.Close()
	return err
}

// find answers key from a live row, if there is one.
func (p *Postgres) find(ctx context.Context, key string, fp []byte) (resp []byte, found bool, err error) {
	var (
		storedFP []byte
		state    int16
	)
	err = p.pool.QueryRow(ctx, p.lookup, key, time.Now().UnixNano()).Scan(&storedFP, &state, &resp)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, nil
	}
	return answer(err, storedFP, fp, state == 1, resp)
}

// lost answers a call whose claim found the key taken by another call.
func (p *Postgres) lost(ctx context.Context, key string, fp []byte) ([]byte, bool, error) {
	resp, found, err := p.find(ctx, key, fp)
	if !found && err == nil {
		err = benchkit.ErrInProgress
	}
	return resp, err == nil, err
}

// Do implements benchkit.Deduper with the SQL pattern: find, claim, run, record.
func (p *Postgres) Do(ctx context.Context, key string, fp []byte, fn func(context.Context) ([]byte, error)) ([]byte, bool, error) {
	if resp, found, err := p.find(ctx, key, fp); found || err != nil {
		return resp, err == nil, err
	}
	now := time.Now()
	tag, err := p.pool.Exec(ctx, p.claim, key, fp, now.Add(benchkit.Retention).UnixNano(), now.UnixNano())
	if err != nil {
		return nil, false, err
	}
	if tag.RowsAffected() == 0 {
		return p.lost(ctx, key, fp)
	}
	resp, ferr := fn(ctx)
	if ferr != nil {
		_, err := p.pool.Exec(context.WithoutCancel(ctx), p.release, key)
		return nil, false, errors.Join(ferr, err)
	}
	_, err = p.pool.Exec(context.WithoutCancel(ctx), p.done, resp, time.Now().Add(benchkit.Retention).UnixNano(), key)
	return resp, false, err
}

// DoTx claims the key, runs fn, and writes its effect and the done row in one
// transaction. A concurrent claim of the same key waits for this one's commit.
func (p *Postgres) DoTx(ctx context.Context, key string, fp []byte, fn benchkit.TxFunc) ([]byte, bool, error) {
	if resp, found, err := p.find(ctx, key, fp); found || err != nil {
		return resp, err == nil, err
	}
	var (
		resp []byte
		lost bool
	)
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		now := time.Now()
		tag, err := tx.Exec(ctx, p.claim, key, fp, now.Add(benchkit.Retention).UnixNano(), now.UnixNano())
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			lost = true
			return nil
		}
		eff, r, err := fn(ctx)
		if err != nil {
			return err
		}
		resp = r
		if _, err := tx.Exec(ctx, p.effect, eff.Key, eff.Value); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, p.done, resp, now.Add(benchkit.Retention).UnixNano(), key)
		return err
	})
	if err != nil {
		return nil, false, err
	}
	if lost {
		return p.lost(ctx, key, fp)
	}
	return resp, false, nil
}

// Preload copies rs in (COPY FROM) and analyzes the table.
func (p *Postgres) Preload(ctx context.Context, rs benchkit.RecordSet) error {
	expires := rs.Completed.Add(benchkit.Retention).UnixNano()
	ks := benchkit.SortedKeys(rs.First, rs.N)
	_, err := p.pool.CopyFrom(ctx, pgx.Identifier{p.schema, "records"},
		[]string{"key", "fp", "state", "response", "expires_at"},
		pgx.CopyFromSlice(len(ks), func(j int) ([]any, error) {
			return []any{ks[j].Key, benchkit.Fingerprint(ks[j].Index), int16(1), benchkit.Response(), expires}, nil
		}))
	if err != nil {
		return fmt.Errorf("copy: %w", err)
	}
	_, err = p.pool.Exec(ctx, `ANALYZE `+p.schema+`.records`)
	return err
}

// Prune deletes expired rows, 1,000 per transaction.
func (p *Postgres) Prune(ctx context.Context) (int, error) {
	total := 0
	for {
		tag, err := p.pool.Exec(ctx, p.prune, time.Now().UnixNano())
		if err != nil {
			return total, err
		}
		total += int(tag.RowsAffected())
		if tag.RowsAffected() < 1000 {
			return total, nil
		}
	}
}

// DiskSize is the size of both tables with their indexes and TOAST data, as
// the server reports it.
func (p *Postgres) DiskSize(ctx context.Context) (int64, error) {
	var n int64
	err := p.pool.QueryRow(ctx, `SELECT pg_total_relation_size($1::regclass) + pg_total_relation_size($2::regclass)`,
		p.schema+".records", p.schema+".effects").Scan(&n)
	return n, err
}

// openBenchPool connects a pool of postgresPoolSize to the server at dsn for
// the contender name, with afterConnect (if set) as its AfterConnect hook,
// and returns it with a random suffix for a fresh schema. It returns an
// error wrapping ErrSkipped when dsn is empty or the server does not answer
// within 5 s.
func openBenchPool(ctx context.Context, dsn, name string, afterConnect func(context.Context, *pgx.Conn) error) (*pgxpool.Pool, string, error) {
	if dsn == "" {
		return nil, "", fmt.Errorf("%w: %s not set (../scripts/postgres.sh start)", benchkit.ErrSkipped, PostgresEnv)
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %s: %w", name, PostgresEnv, err)
	}
	cfg.MaxConns = postgresPoolSize
	cfg.ConnConfig.ConnectTimeout = 3 * time.Second
	cfg.AfterConnect = afterConnect
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", name, err)
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, "", fmt.Errorf("%w: postgres unreachable: %v", benchkit.ErrSkipped, err)
	}
	var suffix [6]byte
	_, _ = rand.Read(suffix[:])
	return pool, hex.EncodeToString(suffix[:]), nil
}
