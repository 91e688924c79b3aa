package bench

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"runtime"
	"time"

	"modernc.org/sqlite"

	"github.com/idemkit/idem/kit/benchkit"
)

// SyncMode is SQLite's synchronous setting.
type SyncMode string

// The synchronous settings measured. In WAL mode FULL syncs the WAL on every
// commit; NORMAL syncs only at checkpoints, so a power loss may lose the last
// commits (not corrupt the file).
const (
	SyncFull   SyncMode = "FULL"
	SyncNormal SyncMode = "NORMAL"
)

// sqliteReaders is the size of the pool of reading connections. Reads run in
// parallel in WAL mode, but modernc.org/sqlite is Go code bound by the
// cores, and each connection has its own page cache: a few per core suffice.
var sqliteReaders = max(4, 2*runtime.GOMAXPROCS(0))

// SQLite is the common SQL dedupe pattern in SQLite (modernc.org/sqlite, WAL):
//
//	SELECT fp, state, response … WHERE key = ?        -- replay: a read
//	INSERT … 'started' ON CONFLICT(key) DO …           -- claim the key
//	fn
//	UPDATE … SET state = 'done', response = ?          -- record the outcome
//
// The SELECT comes first so that a replay is one read that does not take the
// write lock (the baseline's best case for retries); a miss costs one indexed
// read more on a first execution. The claim takes over an expired row (DO
// UPDATE … WHERE expires_at <= now), and does nothing otherwise.
//
// Writes go through a pool of one connection: SQLite has one writer, and
// connections contending for its lock wait in SQLite's busy handler, which
// sleeps for milliseconds (64 writing connections made first executions five
// times slower, with p99 over 2 s; 4 were no better than 1). Reads go through
// a pool of sqliteReaders connections (16 and more were slower than 2 to 8).
// busy_timeout covers the checkpoints that readers and the writer still
// contend for.
type SQLite struct {
	name string
	w, r *sql.DB

	lookup, claim, done, release, effect, insert, prune *sql.Stmt
}

const sqliteSchema = `
CREATE TABLE IF NOT EXISTS records (
	key        TEXT PRIMARY KEY,
	fp         BLOB NOT NULL,
	state      INTEGER NOT NULL, -- 0 started, 1 done
	response   BLOB,
	expires_at INTEGER NOT NULL  -- Unix nanoseconds
);
CREATE INDEX IF NOT EXISTS records_expires ON records (expires_at);
CREATE TABLE IF NOT EXISTS effects (
	key   TEXT PRIMARY KEY,
	value BLOB NOT NULL
);`

// OpenSQLite opens dir/sqlite.db in WAL mode with synchronous=sync.
//
// It switches modernc.org/sqlite to fdatasync(2), process-wide, as every
// Linux build of SQLite (and bbolt) syncs: the library keeps SQLite's source
// default, fsync(2), which on some file systems costs a journal commit more.
func OpenSQLite(ctx context.Context, dir string, sync SyncMode) (benchkit.Deduper, error) {
	name := "sqlite-" + map[SyncMode]string{SyncFull: "full", SyncNormal: "normal"}[sync]
	if _, err := sqlite.Fdatasync(true); err != nil && !errors.Is(err, sqlite.ErrFdatasyncUnavailable) {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	path := filepath.Join(dir, "sqlite.db")
	dsn := func(extra ...string) string {
		q := url.Values{}
		q.Add("_pragma", "journal_mode(WAL)")
		q.Add("_pragma", fmt.Sprintf("synchronous(%s)", sync))
		q.Add("_pragma", "busy_timeout(10000)")
		for i := 0; i < len(extra); i += 2 {
			q.Add(extra[i], extra[i+1])
		}
		return "file:" + path + "?" + q.Encode()
	}
	s := &SQLite{name: name}
	var err error
	if s.w, err = sql.Open("sqlite", dsn("_txlock", "immediate")); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	s.w.SetMaxOpenConns(1)
	s.w.SetMaxIdleConns(1)
	s.w.SetConnMaxIdleTime(0)
	if _, err := s.w.ExecContext(ctx, sqliteSchema); err != nil {
		return nil, errors.Join(fmt.Errorf("%s: schema: %w", name, err), s.w.Close())
	}
	if s.r, err = sql.Open("sqlite", dsn()); err != nil {
		return nil, errors.Join(fmt.Errorf("%s: %w", name, err), s.w.Close())
	}
	s.r.SetMaxOpenConns(sqliteReaders)
	s.r.SetMaxIdleConns(sqliteReaders)
	s.r.SetConnMaxIdleTime(0)

	prep := []struct {
		db    *sql.DB
		stmt  **sql.Stmt
		query string
	}{
		{s.r, &s.lookup, `SELECT fp, state, response FROM records WHERE key = ? AND expires_at > ?`},
		{s.w, &s.claim, `INSERT INTO records (key, fp, state, expires_at) VALUES (?1, ?2, 0, ?3)
			ON CONFLICT (key) DO UPDATE SET fp = excluded.fp, state = 0, response = NULL, expires_at = excluded.expires_at
			WHERE records.expires_at <= ?4`},
		{s.w, &s.done, `UPDATE records SET state = 1, response = ?, expires_at = ? WHERE key = ?`},
		{s.w, &s.release, `DELETE FROM records WHERE key = ? AND state = 0`},
		{s.w, &s.effect, `INSERT INTO effects (key, value) VALUES (?, ?)`},
		{s.w, &s.insert, `INSERT INTO records (key, fp, state, response, expires_at) VALUES (?, ?, 1, ?, ?)`},
		{s.w, &s.prune, `DELETE FROM records WHERE rowid IN
			(SELECT rowid FROM records WHERE expires_at <= ? LIMIT 1000)`},
	}
	for _, p := range prep {
		if *p.stmt, err = p.db.PrepareContext(ctx, p.query); err != nil {
			return nil, errors.Join(fmt.Errorf("%s: prepare: %w", name, err), s.Close())
		}
	}
	return s, nil
}

// Name implements benchkit.Deduper.
func (s *SQLite) Name() string { return s.name }

// Close closes both pools.
func (s *SQLite) Close() error {
	var errs []error
	for _, st := range []*sql.Stmt{s.lookup, s.claim, s.done, s.release, s.effect, s.insert, s.prune} {
		if st != nil {
			errs = append(errs, st.Close())
		}
	}
	if s.r != nil {
		errs = append(errs, s.r.Close())
	}
	return errors.Join(append(errs, s.w.Close())...)
}

// find answers key from a live row, if there is one.
func (s *SQLite) find(ctx context.Context, key string, fp []byte) (resp []byte, found bool, err error) {
	var (
		storedFP []byte
		state    int
	)
	err = s.lookup.QueryRowContext(ctx, key, time.Now().UnixNano()).Scan(&storedFP, &state, &resp)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, false, nil
	}
	return answer(err, storedFP, fp, state == 1, resp)
}

// answer is what a SQL baseline makes of the row it read for a key (err:
// the read failed): a conflict, a call in progress, or a replay of resp.
func answer(err error, storedFP, fp []byte, done bool, resp []byte) ([]byte, bool, error) {
	switch {
	case err != nil:
		return nil, false, err
	case !bytes.Equal(storedFP, fp):
		return nil, true, benchkit.ErrConflict
	case !done:
		return nil, true, benchkit.ErrInProgress
	}
	return resp, true, nil
}

// Do implements benchkit.Deduper with the SQL pattern: find, claim, run, record.
func (s *SQLite) Do(ctx context.Context, key string, fp []byte, fn func(context.Context) ([]byte, error)) ([]byte, bool, error) {
	if resp, found, err := s.find(ctx, key, fp); found || err != nil {
		return resp, err == nil, err
	}
	now := time.Now()
	res, err := s.claim.ExecContext(ctx, key, fp, now.Add(benchkit.Retention).UnixNano(), now.UnixNano())
	if err != nil {
		return nil, false, err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return s.lost(ctx, key, fp, err)
	}
	resp, ferr := fn(ctx)
	if ferr != nil {
		_, err := s.release.ExecContext(context.WithoutCancel(ctx), key)
		return nil, false, errors.Join(ferr, err)
	}
	_, err = s.done.ExecContext(context.WithoutCancel(ctx), resp, time.Now().Add(benchkit.Retention).UnixNano(), key)
	return resp, false, err
}

// lost answers a call whose claim found the key taken by another call.
func (s *SQLite) lost(ctx context.Context, key string, fp []byte, err error) ([]byte, bool, error) {
	if err != nil {
		return nil, false, err
	}
	resp, found, err := s.find(ctx, key, fp)
	if !found && err == nil {
		err = benchkit.ErrInProgress // taken and gone again: let the caller retry
	}
	return resp, err == nil, err
}

// DoTx claims the key, runs fn, and writes its effect and the done row in one
// transaction (BEGIN IMMEDIATE).
func (s *SQLite) DoTx(ctx context.Context, key string, fp []byte, fn benchkit.TxFunc) ([]byte, bool, error) {
	if resp, found, err := s.find(ctx, key, fp); found || err != nil {
		return resp, err == nil, err
	}
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return nil, false, err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	now := time.Now()
	res, err := tx.StmtContext(ctx, s.claim).ExecContext(ctx, key, fp, now.Add(benchkit.Retention).UnixNano(), now.UnixNano())
	if err != nil {
		return nil, false, err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		if rerr := tx.Rollback(); rerr != nil {
			return nil, false, rerr
		}
		return s.lost(ctx, key, fp, err)
	}
	eff, resp, err := fn(ctx)
	if err != nil {
		return nil, false, err
	}
	if _, err := tx.StmtContext(ctx, s.effect).ExecContext(ctx, eff.Key, eff.Value); err != nil {
		return nil, false, err
	}
	if _, err := tx.StmtContext(ctx, s.done).ExecContext(ctx, resp, now.Add(benchkit.Retention).UnixNano(), key); err != nil {
		return nil, false, err
	}
	return resp, false, tx.Commit()
}

// Preload inserts rs in transactions of 10,000 rows, keys sorted.
func (s *SQLite) Preload(ctx context.Context, rs benchkit.RecordSet) error {
	expires := rs.Completed.Add(benchkit.Retention).UnixNano()
	const batch = 10_000
	for off := 0; off < rs.N; off += batch {
		recs := benchkit.SortedKeys(rs.First+off, min(batch, rs.N-off))
		tx, err := s.w.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		ins := tx.StmtContext(ctx, s.insert)
		for _, r := range recs {
			if _, err := ins.ExecContext(ctx, r.Key, benchkit.Fingerprint(r.Index), benchkit.Response(), expires); err != nil {
				return errors.Join(err, tx.Rollback())
			}
		}
		if err := tx.Commit(); err != nil {
			return err
		}
	}
	return nil
}

// Prune deletes expired rows, 1,000 per transaction.
func (s *SQLite) Prune(ctx context.Context) (int, error) {
	total := 0
	for {
		res, err := s.prune.ExecContext(ctx, time.Now().UnixNano())
		if err != nil {
			return total, err
		}
		n, err := res.RowsAffected()
		total += int(n)
		if err != nil || n < 1000 {
			return total, err
		}
	}
}
