package benchkit

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// Deduper is a contender: it runs fn at most once per idempotency key and
// answers later calls with the same key from the stored response.
//
// Do returns fn's response, or the stored one with replayed set. A key reused
// with another fingerprint fails with an error wrapping [ErrConflict]; a key
// whose first call is still running may fail with an error wrapping
// [ErrInProgress] (the naive patterns answer HTTP 409 there; idem waits).
type Deduper interface {
	// Name is the contender's name in tables, for example "sqlite-full".
	Name() string
	// Do runs fn once per key. fp holds the bytes that define "the same
	// request"; the contender may keep a hash of them or the bytes themselves.
	Do(ctx context.Context, key string, fp []byte, fn func(context.Context) ([]byte, error)) (resp []byte, replayed bool, err error)
	// Close releases the store. It does not delete its files.
	Close() error
}

// An Effect is a local side effect of a DoTx call: one row (bucket entry)
// written to the contender's own effects table in the commit that stores the
// call's record.
type Effect struct {
	Key, Value []byte
}

// TxFunc is the function of a DoTx call. It returns the effect to write and
// the response to record. It may run more than once (idem re-runs the fns of
// a shared commit when one of them fails), so it must be pure.
type TxFunc func(ctx context.Context) (Effect, []byte, error)

// TxDeduper is a contender with the DoTx shape: the effect and the done record
// commit together, in one SQL transaction or one bbolt write transaction, and
// no started record is written.
type TxDeduper interface {
	DoTx(ctx context.Context, key string, fp []byte, fn TxFunc) (resp []byte, replayed bool, err error)
}

// Preloader stores done records in bulk, bypassing Do: big transactions, one
// sync at the end. Fixtures use it to store 1e6 records in seconds, before
// any workload runs: it is never called concurrently with other methods.
type Preloader interface {
	Preload(ctx context.Context, rs RecordSet) error
}

// Pruner deletes expired records: those whose retention window ([Retention]
// after completion) ended before now.
type Pruner interface {
	// Prune deletes every expired record and returns how many it deleted.
	Prune(ctx context.Context) (int, error)
}

// Sizer reports the bytes a contender's store takes on disk, for contenders
// whose data lives outside the directory they were opened in (a server's).
// Others are measured by the sizes of the files in their directory.
type Sizer interface {
	DiskSize(ctx context.Context) (int64, error)
}

// stateless marks the bare contender: it stores nothing, so workloads do not
// check its answers for replays and conflicts.
type stateless interface {
	stateless()
}

// Retention is the retention window of every contender: a record expires this
// long after it completed. idem's default; the prune workload stores records
// completed three windows ago.
const Retention = 24 * time.Hour

// Errors that contenders wrap, so that workloads can tell outcomes apart
// whatever the contender.
var (
	// ErrConflict: the key was used before with another fingerprint.
	ErrConflict = errors.New("bench: fingerprint conflict")
	// ErrInProgress: the key's first call has not completed.
	ErrInProgress = errors.New("bench: request in progress")
	// ErrSkipped: the contender cannot run here (no database server), or it
	// lacks what a workload needs (a bare call has no records to prune).
	ErrSkipped = errors.New("skipped")
)

// A RecordSet describes done records for [Preloader.Preload]: the keys
// Key(First) … Key(First+N-1), each with Fingerprint(i) and the shared
// Response, all completed at Completed.
type RecordSet struct {
	First, N  int
	Completed time.Time
}

// Contender opens one kind of store.
type Contender struct {
	// Name is the Deduper's name.
	Name string
	// Open opens a fresh, empty store in dir (an empty directory the caller
	// removes afterwards). It returns an error wrapping ErrSkipped when the
	// contender cannot run here.
	Open func(ctx context.Context, dir string) (Deduper, error)
}

// Contenders lists the contenders that need no database driver, idem first
// (the reference of the ratios): idem, bare and naive-bbolt. The bench module
// appends its SQLite and PostgreSQL contenders to this list; a run takes any
// list, in the order its table shows the rows.
func Contenders() []Contender {
	return []Contender{
		{Name: "idem", Open: OpenIdem},
		{Name: "bare", Open: OpenBare},
		{Name: "naive-bbolt", Open: OpenNaiveBbolt},
	}
}

// Reference is the contender whose figures the ratios divide by, and
// Fallback the one used when the reference has none for a workload.
const (
	Reference = "idem"
	Fallback  = "naive-bbolt"
)

// diskSize is the bytes d takes on disk: its Sizer's answer, or the sum of the
// sizes of the regular files under dir.
func diskSize(ctx context.Context, d Deduper, dir string) (int64, error) {
	if s, ok := d.(Sizer); ok {
		return s.DiskSize(ctx)
	}
	var total int64
	err := filepath.WalkDir(dir, func(path string, e os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.Type().IsRegular() {
			fi, err := e.Info()
			if err != nil {
				return err
			}
			total += fi.Size()
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("bench: size of %s: %w", dir, err)
	}
	return total, nil
}
