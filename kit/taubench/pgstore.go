package taubench

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemmcp"
	"github.com/idemkit/idem/idempg"
)

// The Postgres tables of the retail database, in the schema of a task: one
// per table of the data files (id, its position in the file, its JSON text
// in json.dumps form), and the MCP server's bookkeeping (as EffectsBucket
// and RecoveredBucket) and the Do form's answers (PgDoAnswers).
const (
	PgOrders    = "tau_orders"
	PgUsers     = "tau_users"
	PgProducts  = "tau_products"
	PgEffects   = "tau_mcp_effects"
	PgRecovered = "tau_mcp_recovered"
	// PgDoAnswers holds, per idempotency key, the answer of a write call
	// played through Do on Postgres (the crash schedule's Do form),
	// committed with the call's change: a process that takes the key over
	// after a lease lapsed finds it and answers it instead of running the
	// tool again.
	PgDoAnswers = "tau_do_answers"
)

// pgTables maps a table of Task.Changed to its Postgres table.
var pgTables = map[string]string{"orders": PgOrders, "users": PgUsers, "products": PgProducts}

// pgSchemaSQL creates a task's tables in {schema}. A record's pos is its
// position in the data file; a record a tool creates (none of the retail
// tools does) sorts after every other, by id.
const pgSchemaSQL = `
CREATE TABLE {schema}.tau_orders (id text PRIMARY KEY, pos integer NOT NULL, data text NOT NULL);
CREATE TABLE {schema}.tau_users (id text PRIMARY KEY, pos integer NOT NULL, data text NOT NULL);
CREATE TABLE {schema}.tau_products (id text PRIMARY KEY, pos integer NOT NULL, data text NOT NULL);
CREATE TABLE {schema}.tau_mcp_effects (key text PRIMARY KEY, n integer NOT NULL);
CREATE TABLE {schema}.tau_mcp_recovered (key text PRIMARY KEY);
CREATE TABLE {schema}.tau_do_answers (key text PRIMARY KEY, answer text NOT NULL);
`

// PgQuerier is what PgStore needs of a connection: pgx.Tx and
// *pgxpool.Pool satisfy it.
type PgQuerier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// PgStore is the Store of the retail tables in one Postgres schema, inside
// one transaction: a DoTx fn's pgx.Tx, or one of the caller's own.
type PgStore struct {
	// Ctx is the context of the transaction's statements: a Store's
	// methods have none of their own.
	Ctx context.Context
	// Q runs the statements: the transaction.
	Q PgQuerier
	// Schema holds the tables (quoted in SQL text as an identifier).
	Schema string
	// ForUpdate makes Record lock the row it reads (SELECT … FOR UPDATE),
	// as a write transaction must: at READ COMMITTED (DoTx's level), two
	// transactions that read and then rewrite one record are serialized by
	// the lock, as bbolt's single writer serializes them, and the second
	// reads what the first committed.
	ForUpdate bool
}

// table returns the quoted name of the Postgres table of name.
func (s PgStore) table(name string) (string, error) {
	t, ok := pgTables[name]
	if !ok {
		return "", fmt.Errorf("taubench: no table %q", name)
	}
	return pgx.Identifier{s.Schema, t}.Sanitize(), nil
}

// Record implements Store.
func (s PgStore) Record(name, id string) ([]byte, error) {
	t, err := s.table(name)
	if err != nil {
		return nil, err
	}
	q := "SELECT data FROM " + t + " WHERE id = $1"
	if s.ForUpdate {
		q += " FOR UPDATE"
	}
	var data string
	err = s.Q.QueryRow(s.Ctx, q, id).Scan(&data)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return []byte(data), nil
}

// Put implements Store.
func (s PgStore) Put(name, id string, data []byte) error {
	t, err := s.table(name)
	if err != nil {
		return err
	}
	_, err = s.Q.Exec(s.Ctx, "INSERT INTO "+t+" (id, pos, data) VALUES ($1, 2147483647, $2) "+
		"ON CONFLICT (id) DO UPDATE SET data = EXCLUDED.data", id, string(data))
	return err
}

// Scan implements Store.
func (s PgStore) Scan(name string, fn func(id string, data []byte) (bool, error)) error {
	t, err := s.table(name)
	if err != nil {
		return err
	}
	rows, err := s.Q.Query(s.Ctx, "SELECT id, data FROM "+t+" ORDER BY pos, id")
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var id, data string
		if err := rows.Scan(&id, &data); err != nil {
			return err
		}
		more, err := fn(id, []byte(data))
		if err != nil || !more {
			return err
		}
	}
	return rows.Err()
}

// countEffect implements ledgerStore.
func (s PgStore) countEffect(key string) error {
	_, err := s.Q.Exec(s.Ctx, "INSERT INTO "+pgx.Identifier{s.Schema, PgEffects}.Sanitize()+" AS e (key, n) VALUES ($1, 1) "+
		"ON CONFLICT (key) DO UPDATE SET n = e.n + 1", key)
	return err
}

// markRecovered implements ledgerStore.
func (s PgStore) markRecovered(key string) error {
	_, err := s.Q.Exec(s.Ctx, "INSERT INTO "+pgx.Identifier{s.Schema, PgRecovered}.Sanitize()+" (key) VALUES ($1) "+
		"ON CONFLICT (key) DO NOTHING", key)
	return err
}

// doAnswer returns the answer PgDoAnswers holds for key, if any.
func (s PgStore) doAnswer(key string) (string, bool, error) {
	var answer string
	err := s.Q.QueryRow(s.Ctx, "SELECT answer FROM "+pgx.Identifier{s.Schema, PgDoAnswers}.Sanitize()+" WHERE key = $1", key).Scan(&answer)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, nil
	}
	return answer, err == nil, err
}

// putDoAnswer records key's answer in PgDoAnswers.
func (s PgStore) putDoAnswer(key, answer string) error {
	_, err := s.Q.Exec(s.Ctx, "INSERT INTO "+pgx.Identifier{s.Schema, PgDoAnswers}.Sanitize()+" (key, answer) VALUES ($1, $2)", key, answer)
	return err
}

// The settings of the runner's idempg engines. The lease is idempg's
// shortest (1 s), so that a takeover after a killed process (the crash
// schedule's Do form) waits at most one second: the takeover is what the
// schedule tests, not the wait; heartbeats come eight times a lease, so
// that a loaded machine (the race detector, CI) does not lose a lease it
// holds.
const (
	pgLease        = time.Second
	pgHeartbeat    = 125 * time.Millisecond
	pgPollInterval = 50 * time.Millisecond
	pgIdleInTx     = 10 * time.Second
)

// envChildPG carries the Postgres DSN from the runner to its children
// (crash children, MCP tool servers and the proxies in front of them): in
// the environment, so that a password in it is not on a command line. It
// only tells a child where the database is; arguments decide whether a
// process is a child.
const envChildPG = "IDEM_TAUBENCH_CHILD_PG"

// childEnv returns the environment of a child of a run on pl.
func childEnv(pl place, dsn string) []string {
	if pl.Schema == "" {
		return nil
	}
	return append(os.Environ(), envChildPG+"="+dsn)
}

// newPool opens a pool on dsn, checked with a ping.
func newPool(ctx context.Context, dsn string) (*pgxpool.Pool, error) {
	if dsn == "" {
		return nil, errors.New("taubench: the postgres backend needs a server (Config.PG, a pgx DSN)")
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// pgx's parse errors quote the DSN, password included: say less.
		return nil, errors.New("taubench: the Postgres DSN is not a valid connection string")
	}
	cfg.MaxConns = 8
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("taubench: postgres: %w", err)
	}
	return pool, nil
}

// testStagePrefix, if set, sees and may replace the prefix of a new
// pgStage's schemas (tests only).
var testStagePrefix func(string) string

// pgStage keeps the seeded template in a schema of its own and copies it
// into a new schema per task run.
type pgStage struct {
	pool   *pgxpool.Pool
	work   string // base of the places' Path
	prefix string // of every schema of the run
	tmpl   string
	init   snapshot
	idem   map[string]bool // the rows' idempg schemas made so far
}

func newPgStage(ctx context.Context, dsn, work, dataDir string) (*pgStage, error) {
	d, err := LoadDataset(dataDir)
	if err != nil {
		return nil, err
	}
	pool, err := newPool(ctx, dsn)
	if err != nil {
		return nil, err
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	s := &pgStage{pool: pool, work: work, prefix: "taubench_" + hex.EncodeToString(b[:]), idem: map[string]bool{}}
	if testStagePrefix != nil {
		s.prefix = testStagePrefix(s.prefix)
	}
	s.tmpl = s.prefix + "_template"
	if err := s.seed(ctx, d); err != nil {
		s.close()
		return nil, err
	}
	s.init, err = pgSnapshot(ctx, pool, s.tmpl)
	if err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// seed creates the template schema and copies the dataset into it.
func (s *pgStage) seed(ctx context.Context, d *Dataset) error {
	sch := pgx.Identifier{s.tmpl}.Sanitize()
	if _, err := s.pool.Exec(ctx, "CREATE SCHEMA "+sch+";"+strings.ReplaceAll(pgSchemaSQL, "{schema}", sch)); err != nil {
		return fmt.Errorf("taubench: postgres template: %w", err)
	}
	for _, t := range tables {
		recs := d.records[t.name]
		rows := make([][]any, len(recs))
		for i, r := range recs {
			rows[i] = []any{r.id, int32(i), string(r.json)}
		}
		if _, err := s.pool.CopyFrom(ctx, pgx.Identifier{s.tmpl, pgTables[t.name]}, []string{"id", "pos", "data"}, pgx.CopyFromRows(rows)); err != nil {
			return fmt.Errorf("taubench: postgres template: %w", err)
		}
	}
	return nil
}

func (s *pgStage) initial() snapshot { return s.init }

func (s *pgStage) fresh(ctx context.Context, row string, task int, withIdem bool) (place, error) {
	row = strings.NewReplacer("-", "_").Replace(row)
	pl := place{Path: filepath.Join(s.work, fmt.Sprintf("%s-%d.pg", row, task)), Schema: fmt.Sprintf("%s_%s_%d", s.prefix, row, task)}
	if withIdem {
		// idempg's tables are one schema per row, migrated once: each
		// migration takes a few hundred milliseconds, and the tasks of a
		// row use keys of their own.
		pl.IdemSchema = s.prefix + "_" + row + "_idem"
		if !s.idem[pl.IdemSchema] {
			if _, err := idempg.Migrate(ctx, s.pool, &idempg.Options{Schema: pl.IdemSchema}); err != nil {
				s.drop(pl.IdemSchema)
				return pl, err
			}
			s.idem[pl.IdemSchema] = true
		}
	}
	sch, tmpl := pgx.Identifier{pl.Schema}.Sanitize(), pgx.Identifier{s.tmpl}.Sanitize()
	q := "CREATE SCHEMA " + sch + ";" + strings.ReplaceAll(pgSchemaSQL, "{schema}", sch)
	for _, t := range []string{PgOrders, PgUsers, PgProducts} {
		q += fmt.Sprintf("INSERT INTO %s.%s SELECT * FROM %s.%s;", sch, t, tmpl, t)
	}
	if _, err := s.pool.Exec(ctx, q); err != nil {
		return pl, fmt.Errorf("taubench: postgres schema %s: %w", pl.Schema, err)
	}
	return pl, nil
}

func (s *pgStage) remove(pl place) {
	s.drop(pl.Schema)
	removeBeside(pl.Path)
}

// drop drops schema with everything in it.
func (s *pgStage) drop(schema string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _ = s.pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
}

func (s *pgStage) close() {
	s.drop(s.tmpl)
	for schema := range s.idem {
		s.drop(schema)
	}
	s.pool.Close()
}

// pgSnapshot reads the retail tables of schema.
func pgSnapshot(ctx context.Context, q PgQuerier, schema string) (snapshot, error) {
	return Snapshot(PgStore{Ctx: ctx, Q: q, Schema: schema})
}

// pgDB is one task's schema as one process opened it: a pool of its own,
// and in Idem mode an idempg engine on the place's IdemSchema (or Schema).
type pgDB struct {
	pool   *pgxpool.Pool
	schema string
	e      *idempg.Engine // Idem mode
}

func openPgDB(ctx context.Context, dsn string, pl place, withIdem bool) (*pgDB, error) {
	pool, err := newPool(ctx, dsn)
	if err != nil {
		return nil, err
	}
	d := &pgDB{pool: pool, schema: pl.Schema}
	if withIdem {
		d.e, err = idempg.Open(ctx, pool, &idempg.Options{
			Schema: cmp.Or(pl.IdemSchema, pl.Schema), Lease: pgLease, Heartbeat: pgHeartbeat, PollInterval: pgPollInterval,
			IdleInTransactionTimeout: pgIdleInTx,
		}, &idem.Options{PruneInterval: -1})
		if err != nil {
			pool.Close()
			return nil, err
		}
	}
	return d, nil
}

func (d *pgDB) store(ctx context.Context, q PgQuerier, forUpdate bool) PgStore {
	return PgStore{Ctx: ctx, Q: q, Schema: d.schema, ForUpdate: forUpdate}
}

func (d *pgDB) read(ctx context.Context, fn func(Store) error) error {
	return pgx.BeginTxFunc(ctx, d.pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		return fn(d.store(ctx, tx, false))
	})
}

func (d *pgDB) write(ctx context.Context, fn func(Store) error) error {
	return pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		return fn(d.store(ctx, tx, true))
	})
}

func (d *pgDB) doTx(ctx context.Context, key string, fp []byte, fn func(context.Context, Store) ([]byte, error)) (idem.Result, error) {
	if d.e == nil {
		return idem.Result{}, errNoEngine
	}
	return d.e.DoTx(ctx, key, fp, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		return fn(ctx, d.store(ctx, tx, true))
	})
}

func (d *pgDB) do(ctx context.Context, key string, fp []byte, fn func(context.Context) ([]byte, error)) (idem.Result, error) {
	if d.e == nil {
		return idem.Result{}, errNoEngine
	}
	return d.e.Do(ctx, key, fp, fn)
}

func (d *pgDB) doer() idem.Doer {
	if d.e == nil {
		return nil
	}
	return d.e
}

func (d *pgDB) snapshot(ctx context.Context) (snapshot, error) {
	return pgSnapshot(ctx, d.pool, d.schema)
}

func (d *pgDB) ledger(ctx context.Context) (map[string]int, map[string]bool, error) {
	effects, recovered := map[string]int{}, map[string]bool{}
	rows, err := d.pool.Query(ctx, "SELECT key, n FROM "+pgx.Identifier{d.schema, PgEffects}.Sanitize())
	if err != nil {
		return nil, nil, err
	}
	for rows.Next() {
		var k string
		var n int
		if err := rows.Scan(&k, &n); err != nil {
			rows.Close()
			return nil, nil, err
		}
		effects[k] = n
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	rows, err = d.pool.Query(ctx, "SELECT key FROM "+pgx.Identifier{d.schema, PgRecovered}.Sanitize())
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return nil, nil, err
		}
		recovered[k] = true
	}
	return effects, recovered, rows.Err()
}

func (d *pgDB) close() error {
	var err error
	if d.e != nil {
		err = d.e.Close()
	}
	d.pool.Close()
	return err
}

func (d *pgDB) addTxTool(s *mcp.Server, m *idemmcp.Middleware, def *mcp.Tool, h txToolHandler) {
	if d.e == nil {
		panic("taubench: no engine in baseline mode")
	}
	idemmcp.AddTxTool(s, m, idem.TxDoer[pgx.Tx](d.e), def,
		func(ctx context.Context, req *mcp.CallToolRequest, in map[string]any, tx pgx.Tx) (*mcp.CallToolResult, any, error) {
			return h(ctx, req, in, d.store(ctx, tx, true))
		}, nil)
}
