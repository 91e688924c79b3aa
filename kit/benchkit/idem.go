package benchkit

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
)

// Idem is the engine under test, with its defaults (durable commits, fsync)
// except that the background pruner is off: the baselines have none, and the
// prune workload calls Prune itself.
type Idem struct {
	e    *idem.Engine
	path string
	// name is the contender's name ("idem" unless OpenIdemWith names it).
	name string
	// set, if not nil, changes the engine's Options at each open.
	set func(*idem.Options)
	// pinned, when not zero, is the engine clock's reading (Unix nanoseconds):
	// Preload completes records at the time its RecordSet says.
	pinned atomic.Int64
}

// idemEffects is the user bucket DoTx writes effects to.
var idemEffects = []byte("effects")

// idemPreloadCallers is the number of concurrent DoTx calls that preload
// records; the engine's group commit gathers them into big transactions.
const idemPreloadCallers = 256

// OpenIdem opens an idem engine on dir/idem.db.
func OpenIdem(_ context.Context, dir string) (Deduper, error) {
	i := &Idem{path: filepath.Join(dir, "idem.db"), name: "idem"}
	if err := i.open(false); err != nil {
		return nil, err
	}
	return i, nil
}

// OpenIdemWith returns a Contender's Open: OpenIdem named name, with set
// applied to the engine's Options at each open (a Tracer, an Observer), for
// the rows that measure what an option costs.
func OpenIdemWith(name string, set func(*idem.Options)) func(context.Context, string) (Deduper, error) {
	return func(_ context.Context, dir string) (Deduper, error) {
		i := &Idem{path: filepath.Join(dir, "idem.db"), name: name, set: set}
		if err := i.open(false); err != nil {
			return nil, err
		}
		return i, nil
	}
}

func (i *Idem) open(noSync bool) error {
	o := &idem.Options{PruneInterval: -1, Now: i.now}
	if i.set != nil {
		i.set(o)
	}
	e, err := idem.OpenFile(i.path, &idem.BoltOptions{NoSync: noSync}, o)
	if err != nil {
		return fmt.Errorf("idem: %w", err)
	}
	i.e = e
	return nil
}

func (i *Idem) now() time.Time {
	if p := i.pinned.Load(); p != 0 {
		return time.Unix(0, p)
	}
	return time.Now()
}

// Name implements Deduper.
func (i *Idem) Name() string { return i.name }

// Close closes the engine.
func (i *Idem) Close() error { return i.e.Close() }

// idemErr maps the engine's sentinels to the harness's, keeping the cause.
// It formats nothing: the naive baseline returns a bare sentinel, and text
// built on every refused call would be timed as idem's.
func idemErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, idem.ErrFingerprintMismatch):
		return mapped{ErrConflict, err}
	case errors.Is(err, idem.ErrInProgress):
		return mapped{ErrInProgress, err}
	}
	return err
}

// mapped is an engine error under the harness's sentinel.
type mapped struct{ sentinel, cause error }

func (m mapped) Error() string   { return m.sentinel.Error() + ": " + m.cause.Error() }
func (m mapped) Unwrap() []error { return []error{m.sentinel, m.cause} }

// Do calls Engine.Do.
func (i *Idem) Do(ctx context.Context, key string, fp []byte, fn func(context.Context) ([]byte, error)) ([]byte, bool, error) {
	res, err := i.e.Do(ctx, key, fp, fn)
	return res.Response, res.Replayed, idemErr(err)
}

// DoTx calls Engine.DoTx; fn's effect goes to the "effects" bucket in the
// transaction that stores the record.
func (i *Idem) DoTx(ctx context.Context, key string, fp []byte, fn TxFunc) ([]byte, bool, error) {
	res, err := i.e.DoTx(ctx, key, fp, func(ctx context.Context, tx *idem.Tx) ([]byte, error) {
		eff, resp, err := fn(ctx)
		if err != nil {
			return nil, err
		}
		b, err := tx.Bucket(idemEffects)
		if err != nil {
			return nil, err
		}
		return resp, b.Put(eff.Key, eff.Value)
	})
	return res.Response, res.Replayed, idemErr(err)
}

// Prune calls Engine.Prune.
func (i *Idem) Prune(ctx context.Context) (int, error) { return i.e.Prune(ctx) }

// Preload stores rs through the public API, since the engine offers no bulk
// import: it reopens the file without fsync, pins the engine's clock to
// rs.Completed, and runs idemPreloadCallers concurrent DoTx calls, whose
// records the group commit gathers into big transactions. It then reopens the
// file durable, so what the workloads measure starts from a fresh engine
// (empty caches) on the stored records.
func (i *Idem) Preload(ctx context.Context, rs RecordSet) (err error) {
	if rs.N == 0 {
		return nil
	}
	if err := i.e.Close(); err != nil {
		return err
	}
	if err := i.open(true); err != nil {
		return err
	}
	i.pinned.Store(rs.Completed.UnixNano())
	defer func() {
		i.pinned.Store(0)
		err = errors.Join(err, i.e.Close(), i.open(false))
	}()
	ks := SortedKeys(rs.First, rs.N) // a commit's records then share pages
	_, err = RunOps(ctx, idemPreloadCallers, Load{Ops: rs.N}, func(ctx context.Context, j int) error {
		k := ks[j]
		res, err := i.e.DoTx(ctx, k.Key, Fingerprint(k.Index), func(context.Context, *idem.Tx) ([]byte, error) {
			return response, nil
		})
		return checkFirst(res.Response, res.Replayed, err)
	})
	return err
}
