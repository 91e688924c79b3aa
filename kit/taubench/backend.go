package taubench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"go.etcd.io/bbolt"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemmcp"
)

// Backend is where a run keeps each task's retail database and idem's
// records.
type Backend string

const (
	// Bolt keeps them in one bbolt file per task: the retail buckets beside
	// the engine's (idem.Open), DoTx's fn writing through the *idem.Tx.
	Bolt Backend = "bbolt"
	// Postgres keeps them in one schema per task on the server Config.PG
	// names: the retail tables (PgStore) beside idempg's, DoTx's fn writing
	// through the pgx.Tx in which the done record commits.
	Postgres Backend = "postgres"
)

// place is where one task's database lives: a bbolt file, or a Postgres
// schema (and idempg's tables in IdemSchema, one per row of the report:
// tasks' keys differ, a schedule's repeat them). Path is set for both: on
// Postgres it names no file, only the base of the files a command puts
// beside it (MCPOptions.Command).
type place struct {
	Path       string `json:"db"`
	Schema     string `json:"schema,omitempty"`
	IdemSchema string `json:"idem_schema,omitempty"`
}

// stage makes a fresh copy of the seeded database for each task run.
type stage interface {
	// initial is the seeded database's content.
	initial() snapshot
	// fresh makes a copy for task in row; idem says whether idem's records
	// live beside it (Postgres: in the row's schema, migrated on first use).
	fresh(ctx context.Context, row string, task int, idem bool) (place, error)
	// remove deletes a copy, with whatever lives beside it.
	remove(pl place)
	// close removes the template.
	close()
}

// newStage seeds the template of cfg's backend in work.
func newStage(ctx context.Context, cfg *Config, work string) (stage, error) {
	switch cfg.Backend {
	case Bolt:
		return newBoltStage(work, cfg.DataDir)
	case Postgres:
		return newPgStage(ctx, cfg.PG, work, cfg.DataDir)
	}
	return nil, fmt.Errorf("taubench: unknown backend %q (want %s or %s)", cfg.Backend, Bolt, Postgres)
}

// boltStage copies a seeded template file.
type boltStage struct {
	work, template string
	init           snapshot
}

func newBoltStage(work, dataDir string) (*boltStage, error) {
	s := &boltStage{work: work, template: filepath.Join(work, "template.db")}
	if err := seedFile(s.template, dataDir); err != nil {
		return nil, err
	}
	var err error
	s.init, err = snapshotFile(s.template)
	return s, err
}

func (s *boltStage) initial() snapshot { return s.init }

func (s *boltStage) fresh(_ context.Context, row string, task int, _ bool) (place, error) {
	pl := place{Path: filepath.Join(s.work, fmt.Sprintf("%s-%d.db", row, task))}
	return pl, copyFile(s.template, pl.Path)
}

func (s *boltStage) remove(pl place) {
	os.Remove(pl.Path)
	removeBeside(pl.Path)
}

// removeBeside removes the files named path followed by a dot and a suffix.
// An empty path names no file, so nothing is beside it: its pattern would be
// ".*", every dot file of the working directory.
func removeBeside(path string) {
	if path == "" {
		return
	}
	quoted := strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`).Replace(path)
	beside, _ := filepath.Glob(quoted + ".*")
	for _, f := range beside {
		os.Remove(f)
	}
}

func (s *boltStage) close() {}

// taskDB is one task's database and, in Idem mode, its engine, as one
// process opened it.
type taskDB interface {
	// read runs a read tool's fn in a read-only transaction.
	read(ctx context.Context, fn func(Store) error) error
	// write runs fn in a write transaction of its own, outside any engine,
	// and commits it if fn returns nil.
	write(ctx context.Context, fn func(Store) error) error
	// doTx runs fn through the engine's DoTx, writing in its transaction.
	doTx(ctx context.Context, key string, fp []byte, fn func(ctx context.Context, s Store) ([]byte, error)) (idem.Result, error)
	// do runs fn through the engine's Do.
	do(ctx context.Context, key string, fp []byte, fn func(ctx context.Context) ([]byte, error)) (idem.Result, error)
	// doer is the engine, for adapters.
	doer() idem.Doer
	// snapshot reads the retail tables.
	snapshot(ctx context.Context) (snapshot, error)
	// ledger reads the MCP server's bookkeeping: effects per key
	// (EffectsBucket) and the keys run recovered (RecoveredBucket).
	ledger(ctx context.Context) (effects map[string]int, recovered map[string]bool, err error)
	// addTxTool registers a write tool of the DoTx form on s through m
	// (Idem mode).
	addTxTool(s *mcp.Server, m *idemmcp.Middleware, def *mcp.Tool, h txToolHandler)
	close() error
}

// ledgerStore is a Store that also keeps the MCP server's bookkeeping in
// its transaction: BoltStore and PgStore.
type ledgerStore interface {
	Store
	// countEffect adds one to key's effects (EffectsBucket).
	countEffect(key string) error
	// markRecovered marks key as run recovered (RecoveredBucket).
	markRecovered(key string) error
}

// errNoEngine is the error of an engine call in Baseline mode.
var errNoEngine = errors.New("taubench: no engine in baseline mode")

// openDB opens the task database at pl: with an engine if withIdem. dsn
// names the Postgres server when pl is a schema.
func openDB(ctx context.Context, pl place, withIdem bool, dsn string) (taskDB, error) {
	if pl.Schema != "" {
		return openPgDB(ctx, dsn, pl, withIdem)
	}
	if withIdem {
		e, err := idem.Open(pl.Path, &idem.Options{PruneInterval: -1})
		if err != nil {
			return nil, err
		}
		return boltEngineDB{e}, nil
	}
	db, err := bbolt.Open(pl.Path, 0o600, nil)
	if err != nil {
		return nil, err
	}
	return boltDB{db}, nil
}

// boltDB is a bbolt file without idem (Baseline mode).
type boltDB struct{ db *bbolt.DB }

func (d boltDB) read(_ context.Context, fn func(Store) error) error {
	return d.db.View(func(tx *bbolt.Tx) error { return fn(BoltStore{BoltTx{tx}}) })
}

func (d boltDB) write(_ context.Context, fn func(Store) error) error {
	return d.db.Update(func(tx *bbolt.Tx) error { return fn(BoltStore{BoltTx{tx}}) })
}

func (boltDB) doTx(context.Context, string, []byte, func(context.Context, Store) ([]byte, error)) (idem.Result, error) {
	return idem.Result{}, errNoEngine
}

func (boltDB) do(context.Context, string, []byte, func(context.Context) ([]byte, error)) (idem.Result, error) {
	return idem.Result{}, errNoEngine
}

func (boltDB) doer() idem.Doer { return nil }

func (d boltDB) snapshot(ctx context.Context) (s snapshot, err error) {
	err = d.read(ctx, func(st Store) error { s, err = Snapshot(st); return err })
	return s, err
}

func (d boltDB) ledger(context.Context) (effects map[string]int, recovered map[string]bool, err error) {
	err = d.db.View(func(tx *bbolt.Tx) error {
		effects, recovered = boltLedger(tx.Bucket([]byte(EffectsBucket)), tx.Bucket([]byte(RecoveredBucket)))
		return nil
	})
	return effects, recovered, err
}

func (d boltDB) close() error { return d.db.Close() }

// boltEngineDB is a bbolt file with idem's engine on it (Idem mode).
type boltEngineDB struct{ e *idem.Engine }

func (d boltEngineDB) read(_ context.Context, fn func(Store) error) error {
	return d.e.View(func(tx *bbolt.Tx) error { return fn(BoltStore{BoltTx{tx}}) })
}

func (boltEngineDB) write(context.Context, func(Store) error) error {
	return errors.New("taubench: the bbolt engine owns its file: write through DoTx")
}

func (d boltEngineDB) doTx(ctx context.Context, key string, fp []byte, fn func(context.Context, Store) ([]byte, error)) (idem.Result, error) {
	return d.e.DoTx(ctx, key, fp, func(ctx context.Context, tx *idem.Tx) ([]byte, error) {
		return fn(ctx, BoltStore{IdemTx{tx}})
	})
}

func (d boltEngineDB) do(ctx context.Context, key string, fp []byte, fn func(context.Context) ([]byte, error)) (idem.Result, error) {
	return d.e.Do(ctx, key, fp, fn)
}

func (d boltEngineDB) doer() idem.Doer { return d.e }

func (d boltEngineDB) snapshot(ctx context.Context) (s snapshot, err error) {
	err = d.read(ctx, func(st Store) error { s, err = Snapshot(st); return err })
	return s, err
}

func (d boltEngineDB) ledger(context.Context) (effects map[string]int, recovered map[string]bool, err error) {
	err = d.e.View(func(tx *bbolt.Tx) error {
		effects, recovered = boltLedger(tx.Bucket([]byte(EffectsBucket)), tx.Bucket([]byte(RecoveredBucket)))
		return nil
	})
	return effects, recovered, err
}

func (d boltEngineDB) close() error { return d.e.Close() }

// boltLedger reads the MCP bookkeeping buckets; either may be nil.
func boltLedger(eb, rb *bbolt.Bucket) (map[string]int, map[string]bool) {
	effects, recovered := map[string]int{}, map[string]bool{}
	if eb != nil {
		_ = eb.ForEach(func(k, v []byte) error {
			if len(v) == 8 {
				effects[string(k)] = int(binary.BigEndian.Uint64(v))
			}
			return nil
		})
	}
	if rb != nil {
		_ = rb.ForEach(func(k, _ []byte) error {
			recovered[string(k)] = true
			return nil
		})
	}
	return effects, recovered
}

// countEffect implements ledgerStore.
func (s BoltStore) countEffect(key string) error {
	bkt, err := s.B.Bucket([]byte(EffectsBucket))
	if err != nil {
		return err
	}
	var n uint64
	if v := bkt.Get([]byte(key)); len(v) == 8 {
		n = binary.BigEndian.Uint64(v)
	}
	return bkt.Put([]byte(key), binary.BigEndian.AppendUint64(nil, n+1))
}

// markRecovered implements ledgerStore.
func (s BoltStore) markRecovered(key string) error {
	bkt, err := s.B.Bucket([]byte(RecoveredBucket))
	if err != nil {
		return err
	}
	return bkt.Put([]byte(key), []byte{1})
}

// txToolHandler is a write tool's handler of the DoTx form, given the
// engine's transaction as a Store.
type txToolHandler = func(ctx context.Context, req *mcp.CallToolRequest, in map[string]any, st Store) (*mcp.CallToolResult, any, error)

func (boltDB) addTxTool(*mcp.Server, *idemmcp.Middleware, *mcp.Tool, txToolHandler) {
	panic("taubench: no engine in baseline mode")
}

func (d boltEngineDB) addTxTool(s *mcp.Server, m *idemmcp.Middleware, def *mcp.Tool, h txToolHandler) {
	idemmcp.AddTxTool(s, m, idem.TxDoer[*idem.Tx](d.e), def,
		func(ctx context.Context, req *mcp.CallToolRequest, in map[string]any, tx *idem.Tx) (*mcp.CallToolResult, any, error) {
			return h(ctx, req, in, BoltStore{IdemTx{tx}})
		}, nil)
}
