package benchkit

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync/atomic"
	"time"
)

// FixtureSpec is the stored state a workload starts from. Workloads with equal
// specs share one fixture per contender.
type FixtureSpec struct {
	// Stored done records, keys 0 … Stored-1, completed now.
	Stored int
	// Recent is how many of them (the last ones) complete through Do after
	// the others are bulk-loaded: the keys "completed within the last Recent
	// calls", as the replay workload's "recent" mode needs. At most Stored.
	Recent int
	// Expired done records, keys Stored … Stored+Expired-1, completed three
	// retention windows ago: the prune workload's garbage.
	Expired int
}

// fixtureCallers is the number of callers that run Do while a fixture loads
// (its recent records, or every record for a contender without Preloader).
const fixtureCallers = 64

// preloadChunk is the number of records per Preload call, so the progress of
// a long load shows and a cancelled one stops soon.
const preloadChunk = 100_000

// Fixture is a contender opened in a fresh directory with its spec's records
// stored.
type Fixture struct {
	Spec FixtureSpec
	D    Deduper
	Dir  string
	// HeapBefore is the Go heap in use (after a GC) before the store was
	// opened; the memory workload measures the growth from it.
	HeapBefore uint64
	// Loaded is how long storing the records took.
	Loaded time.Duration

	fresh atomic.Int64 // the next key index nobody used
	disk  *diskCounter // the block device holding Dir; nil when not found
}

// OpenFixture opens c in dir (which must exist and be empty) and stores
// spec's records: the expired ones and all but the recent ones in bulk
// (Preloader), then the recent ones through Do. progress, if not nil, is told
// how many records are stored as the load goes on. An error wrapping
// ErrSkipped means the contender cannot run here, or cannot make this state.
func OpenFixture(ctx context.Context, c Contender, dir string, spec FixtureSpec, progress func(done int)) (*Fixture, error) {
	if spec.Recent > spec.Stored {
		return nil, fmt.Errorf("bench: fixture %+v: more recent records than stored", spec)
	}
	if progress == nil {
		progress = func(int) {}
	}
	heap := heapInUse()
	d, err := c.Open(ctx, dir)
	if err != nil {
		return nil, err
	}
	f := &Fixture{Spec: spec, D: d, Dir: dir, HeapBefore: heap, disk: newDiskCounter(dir)}
	f.fresh.Store(int64(spec.Stored + spec.Expired))
	start := time.Now()
	if err := f.load(ctx, progress); err != nil {
		return nil, errors.Join(err, d.Close())
	}
	f.Loaded = time.Since(start)
	return f, nil
}

func (f *Fixture) load(ctx context.Context, progress func(int)) error {
	s := f.Spec
	pre, canPreload := f.D.(Preloader)
	done := 0
	bulk := func(first, n int, completed time.Time) error {
		for off := 0; off < n; off += preloadChunk {
			rs := RecordSet{First: first + off, N: min(preloadChunk, n-off), Completed: completed}
			if err := pre.Preload(ctx, rs); err != nil {
				return fmt.Errorf("bench: %s: preload: %w", f.D.Name(), err)
			}
			done += rs.N
			progress(done)
		}
		return nil
	}
	if s.Expired > 0 {
		if !canPreload {
			return fmt.Errorf("%w: %s cannot store expired records", ErrSkipped, f.D.Name())
		}
		if err := bulk(s.Stored, s.Expired, time.Now().Add(-3*Retention)); err != nil {
			return err
		}
	}
	first := 0
	if canPreload {
		if err := bulk(0, s.Stored-s.Recent, time.Now()); err != nil {
			return err
		}
		first = s.Stored - s.Recent
	}
	if first == s.Stored {
		return nil
	}
	// The rest through Do, taken in index order by the callers, so that the
	// last Recent keys are the most recently completed ones.
	_, err := RunOps(ctx, fixtureCallers, Load{Ops: s.Stored - first}, func(ctx context.Context, i int) error {
		k := first + i
		_, _, err := f.D.Do(ctx, Key(k), Fingerprint(k), respond)
		if i%1000 == 999 {
			progress(done + i + 1)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("bench: %s: load through Do: %w", f.D.Name(), err)
	}
	return nil
}

// FreshKey returns the index of a key no call has used yet.
func (f *Fixture) FreshKey() int { return int(f.fresh.Add(1) - 1) }

// Close closes the contender and removes its directory.
func (f *Fixture) Close() error {
	return errors.Join(f.D.Close(), os.RemoveAll(f.Dir))
}

// respond is the fn of every Do in the workloads: it returns the shared
// response and does no I/O.
func respond(context.Context) ([]byte, error) { return response, nil }

// heapInUse is the Go heap in use after a full collection, in bytes.
func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
