package benchkit

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"go.etcd.io/bbolt"
)

// ceilingMetric is the unit of the ceiling workload's derived figure: the
// first executions per second that its puts per second allow at two records
// per call.
const ceilingMetric = "ceiling-Do/s"

// ceilingPrefix starts the name of the ceiling workload.
const ceilingPrefix = "ceiling/"

// recordsPerDo is the number of records a first execution through Do
// writes: started, then done.
const recordsPerDo = 2

// CeilingWorkload measures what bbolt itself allows on this disk, the
// ceiling of any engine that writes two records per call into bbolt: one
// caller commits durable write transactions of putsPerTx puts each, with
// 36-byte random keys (Key) and 200-byte values (Response), into a bucket of
// stored records. It runs on a plain bbolt file of its own in the fixture's
// directory, with bbolt's default options (as naive-bbolt's), on the naive-bbolt
// contender only: its figure is bbolt's, not a contender's.
//
// Its operations are puts: ops/s is puts per second, the latencies are those
// of whole transactions, and the metric "ceiling-Do/s" is puts per second
// over two records per call. SetRatios shows idem's first executions as a
// fraction of it.
func CeilingWorkload(stored, putsPerTx int, load Load) Workload {
	putsPerTx = max(putsPerTx, 1)
	return Workload{
		Name:       fmt.Sprintf("%sputs-per-tx=%d", ceilingPrefix, putsPerTx),
		Fixture:    FixtureSpec{Stored: stored},
		Callers:    1,
		Load:       load,
		Bytes:      ResponseSize * putsPerTx,
		Contenders: []string{Fallback},
		Run: func(ctx context.Context, f *Fixture, load Load) (*Result, error) {
			if f.D.Name() != Fallback {
				return nil, fmt.Errorf("%w: the ceiling is measured through plain bbolt, on %s's row", ErrSkipped, Fallback)
			}
			return runCeiling(ctx, f, stored, putsPerTx, load)
		},
	}
}

var ceilingBucket = []byte("records")

// openCeilingDB opens a plain bbolt file of its own, name, in the
// fixture's directory, with stored records; closing it removes it.
func openCeilingDB(ctx context.Context, f *Fixture, name string, stored int) (db *bbolt.DB, closeDB func() error, err error) {
	path := filepath.Join(f.Dir, name)
	db, err = bbolt.Open(path, 0o600, &bbolt.Options{Timeout: time.Second})
	if err != nil {
		return nil, nil, err
	}
	closeDB = func() error { return errors.Join(db.Close(), os.Remove(path)) }
	if err := ceilingPreload(ctx, db, stored); err != nil {
		return nil, nil, errors.Join(fmt.Errorf("storing %d records: %w", stored, err), closeDB())
	}
	return db, closeDB, nil
}

func runCeiling(ctx context.Context, f *Fixture, stored, putsPerTx int, load Load) (res *Result, err error) {
	db, closeDB, err := openCeilingDB(ctx, f, "ceiling.db", stored)
	if err != nil {
		return nil, fmt.Errorf("ceiling: %w", err)
	}
	defer func() { err = errors.Join(err, closeDB()) }()
	// The keys of every transaction, made before any is timed: indexes from
	// stored up, never stored before.
	txs := max(load.Ops, 1) + load.Warmup
	keys := make([][]byte, txs*putsPerTx)
	for j := range keys {
		keys[j] = []byte(Key(stored + j))
	}
	tx := func(_ context.Context, i int) error {
		return db.Update(func(tx *bbolt.Tx) error {
			b := tx.Bucket(ceilingBucket)
			for _, k := range keys[i*putsPerTx : (i+1)*putsPerTx] {
				if err := b.Put(k, response); err != nil {
					return err
				}
			}
			return nil
		})
	}
	r, err := runCounted(ctx, f, 1, load, countWrites, tx)
	if err != nil {
		return nil, fmt.Errorf("ceiling: %w", err)
	}
	txCount := r.Ops
	r.Ops *= putsPerTx
	puts := r.OpsPerSec()
	r.Score = puts
	r.ScoreUnit = "ops/s"
	ceiling := puts / recordsPerDo
	note := fmt.Sprintf("plain bbolt, %d durable transactions of %d puts in %.2fs: ceiling %s Do/s at %d records per call; p50/p99 per transaction",
		txCount, putsPerTx, r.Elapsed.Seconds(), thousands(ceiling), recordsPerDo)
	for i, m := range r.Metrics {
		if m.Unit == writtenUnit { // counted per transaction: per put
			r.Metrics[i] = Metric{m.Value / float64(putsPerTx), "written-B/put"}
			note += "; " + formatBytes(m.Value/float64(putsPerTx)) + " written/put"
		}
	}
	if _, ok := r.Metric("written-B/put"); !ok {
		note += "; written/put n/a"
	}
	r.Metrics = append(r.Metrics, Metric{puts, "puts/s"}, Metric{ceiling, ceilingMetric})
	r.Note = note
	return r, nil
}

// batchCeilingMetric is the batch ceiling's figure: commits of one put
// each, gathered by bbolt's Batch, per second.
const batchCeilingMetric = "bbolt-batch-puts/s"

// BatchCeilingWorkload is bbolt's own group commit on this disk, the
// ceiling beside the many-caller rows: callers concurrent callers each put
// one 200-byte value at a fresh random key (Key) through bbolt's DB.Batch,
// which gathers concurrent calls into one durable transaction (fsync'ed, as
// every commit with bbolt's defaults), on a plain bbolt file of its own
// holding stored records. It runs on naive-bbolt's row only, as the
// ceiling does. Its operations are puts: one record per call, as a DoTx
// whose effect shares the record's commit, or a Do's records brought up to
// date behind a journal.
func BatchCeilingWorkload(stored, callers int, load Load) Workload {
	return Workload{
		Name:       fmt.Sprintf("%sbbolt-batch/callers=%d", ceilingPrefix, callers),
		Fixture:    FixtureSpec{Stored: stored},
		Callers:    callers,
		Load:       load,
		Bytes:      ResponseSize,
		Contenders: []string{Fallback},
		Run: func(ctx context.Context, f *Fixture, load Load) (res *Result, err error) {
			if f.D.Name() != Fallback {
				return nil, fmt.Errorf("%w: the batch ceiling is measured through plain bbolt, on %s's row", ErrSkipped, Fallback)
			}
			db, closeDB, err := openCeilingDB(ctx, f, "batch-ceiling.db", stored)
			if err != nil {
				return nil, fmt.Errorf("batch ceiling: %w", err)
			}
			defer func() { err = errors.Join(err, closeDB()) }()
			r, err := runCounted(ctx, f, callers, load, countWrites, func(_ context.Context, i int) error {
				k := []byte(Key(stored + i))
				return db.Batch(func(tx *bbolt.Tx) error { return tx.Bucket(ceilingBucket).Put(k, response) })
			})
			if err != nil {
				return nil, fmt.Errorf("batch ceiling: %w", err)
			}
			r.Metrics = append(r.Metrics, Metric{r.OpsPerSec(), batchCeilingMetric})
			r.Note = "plain bbolt, one put per call through DB.Batch (durable group commits); " + r.Note
			return r, nil
		},
	}
}

// ceilingPreload stores records 0 … n-1 in transactions of 10,000 sorted
// keys, without fsync until the end, as naive-bbolt's Preload does.
func ceilingPreload(ctx context.Context, db *bbolt.DB, n int) error {
	db.NoSync = true
	defer func() { db.NoSync = false }()
	if err := db.Update(func(tx *bbolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(ceilingBucket)
		return err
	}); err != nil {
		return err
	}
	const batch = 10_000
	for off := 0; off < n; off += batch {
		if err := ctx.Err(); err != nil {
			return err
		}
		ks := SortedKeys(off, min(batch, n-off))
		err := db.Update(func(tx *bbolt.Tx) error {
			b := tx.Bucket(ceilingBucket)
			for _, k := range ks {
				if err := b.Put([]byte(k.Key), response); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return db.Sync()
}
