package idem

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"

	"go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/internal/boltfile"
)

// Engine is an open idem file: the engine of idemcore (the state machine,
// written once for every backend) over the bbolt backend (backend.go). It is
// safe for concurrent use.
type Engine struct {
	c *idemcore.Engine[*Tx]
	b *boltBackend
}

// Open opens or creates the idem file at path with the engine's settings opts
// (nil for defaults) and the bbolt file's defaults: OpenFile(path, nil, opts).
func Open(path string, opts *Options) (*Engine, error) {
	return OpenFile(path, nil, opts)
}

// OpenFile opens or creates the idem file at path, with the bbolt file's
// settings file and the engine's settings opts (nil for defaults, each). One
// Engine holds a file at a time: another open of the same file, in this
// process or another, fails after file.LockTimeout with an error that matches
// bbolt's errors.ErrTimeout. A file of format version 1 (the first) is read
// as it is and, unless file.ReadOnly, migrated to version 2 in the open's
// first transaction (its records keep their windows; its interrupted
// executions are kept until resolved, since version 1 did not record the
// policy); a file of a newer version fails with ErrFormat and is left as it
// is. A damaged file (truncated below its last page in use, or a page bbolt
// panics on) fails with an error wrapping ErrCorrupt and is released: a later
// open of the repaired file succeeds. Settings that have no meaning fail
// with an error wrapping ErrOptions, before the file is touched.
func OpenFile(path string, file *BoltOptions, opts *Options) (*Engine, error) {
	return open(path, file, opts, nil)
}

// open is OpenFile, with the backend wrapped by wrap if it is not nil (the
// conformance suite's test backends, through export_test.go).
func open(path string, file *BoltOptions, opts *Options, wrap func(idemcore.Backend[*Tx]) idemcore.Backend[*Tx]) (*Engine, error) {
	var (
		o Options
		f BoltOptions
	)
	if opts != nil {
		o = *opts
	}
	if file != nil {
		f = *file
	}
	if err := o.Validate(); err != nil {
		return nil, &OpError{Op: "open", Path: path, Err: err}
	}
	if err := f.validate(); err != nil {
		return nil, &OpError{Op: "open", Path: path, Err: err}
	}
	o = o.WithDefaults()
	if f.LockTimeout <= 0 {
		f.LockTimeout = DefaultLockTimeout
	}
	if f.ReadOnly {
		fi, err := os.Stat(path)
		if err == nil && fi.Size() == 0 {
			err = fmt.Errorf("%w: the file is empty", ErrFormat)
		}
		if err == nil && fi.IsDir() {
			err = &fs.PathError{Op: "open", Path: path, Err: syscall.EISDIR}
		}
		if err != nil {
			return nil, &OpError{Op: "open", Path: path, Err: err}
		}
	}
	db, err := openBolt(path, &bbolt.Options{
		Timeout:      f.LockTimeout,
		NoSync:       f.NoSync,
		ReadOnly:     f.ReadOnly,
		FreelistType: bbolt.FreelistMapType,
		// NoFreelistSync would save a page per commit, but bbolt then walks
		// every page at Open in a goroutine of its own, where a damaged page
		// panics beyond recovery and kills the program: not worth it.
		NoStatistics: true,
		MaxSize:      max(f.MaxSize, 0),
		// A negative size would make bbolt's map smaller than the file.
		InitialMmapSize: max(f.InitialMmapSize, 0),
	})
	if err != nil {
		if errors.Is(err, bolterrors.ErrTimeout) {
			err = fmt.Errorf("file is in use by another program or engine (no lock after %v): %w", f.LockTimeout, err)
		}
		return nil, &OpError{Op: "open", Path: path, Err: err}
	}
	if err := firstRead(db, func() error { return initFile(db, f.ReadOnly) }); err != nil {
		return nil, &OpError{Op: "open", Path: path, Err: err}
	}
	b := newBoltBackend(db, &f, &o)
	if err := firstRead(db, func() (err error) {
		b.j, b.replayed, err = openJournal(path, db, b.pipe, b.ov, &f, o.Logger)
		return err
	}); err != nil {
		b.pipe.Stop()
		return nil, &OpError{Op: "open", Path: path, Err: err}
	}
	if err := firstRead(db, func() error { return db.View(b.st.loadSlots) }); err != nil {
		b.stopJournal()
		return nil, &OpError{Op: "open", Path: path, Err: err}
	}
	for name := range b.ov.buckets { // replayed into the overlay, not into bbolt
		if sl, ok := parseSlot([]byte(name)); ok {
			b.st.addSlot(sl)
		}
	}
	if b.j != nil && b.pipe.Observe != nil {
		b.j.Observe = b.pipe.Observe
	}
	var cb idemcore.Backend[*Tx] = b
	if wrap != nil {
		cb = wrap(b)
	}
	c, err := idemcore.New(cb, o)
	if err != nil {
		_ = b.Close()
		return nil, &OpError{Op: "open", Path: path, Err: err}
	}
	return &Engine{c: c, b: b}, nil
}

// openBolt is bbolt.Open through internal/boltfile: a file whose meta pages
// contradict it (truncated below its last page, which bbolt would map and
// fault on) is refused before bbolt maps it, and a panic of bbolt's on a
// damaged page releases the file; both are errors wrapping ErrCorrupt.
func openBolt(path string, o *bbolt.Options) (*bbolt.DB, error) {
	db, err := boltfile.Open(path, 0o600, o)
	switch {
	case errors.Is(err, boltfile.ErrDamaged):
		err = fmt.Errorf("%w: %w; run `idem check` and restore from a backup", ErrCorrupt, err)
	case errors.Is(err, bolterrors.ErrInvalid), errors.Is(err, bolterrors.ErrVersionMismatch):
		// Random bytes, another program's file: not an idem file.
		err = fmt.Errorf("%w: %w", ErrFormat, err)
	}
	return db, err
}

// firstRead runs one of Open's first transactions on db, which read pages
// bbolt.Open did not: a panic of bbolt's on a damaged page there is an error
// wrapping ErrCorrupt, as in openBolt, and on any failure db is closed (the
// transaction rolled back first), so the file is released.
func firstRead(db *bbolt.DB, read func() error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = damaged(v)
		}
		if err != nil {
			_ = db.Close()
		}
	}()
	return read()
}

// Do runs fn once per idempotency key and records its outcome in the file,
// so that every later call with the key gets that outcome back instead of
// running fn again: a started record is committed and synced before fn runs,
// a done record with fn's response and error before Do returns (concurrent
// calls share those commits). idemcore.Engine.Do gives the contract: the key
// rules, fingerprints, waiting, the outcomes of fn, recovery, re-entrance.
func (e *Engine) Do(ctx context.Context, key string, fingerprint []byte, fn func(context.Context) ([]byte, error)) (Result, error) {
	return e.c.Do(ctx, key, fingerprint, fn)
}

// Close is Shutdown without a deadline.
func (e *Engine) Close() error { return e.c.Close() }

// Shutdown closes the engine: new calls fail with ErrClosed, the contexts
// given to running fns and handlers are cancelled, and Shutdown waits for
// running calls, then stops the pruner, the dispatcher and the commit
// pipeline and closes the file, returning the file's close error. If ctx
// ends first, Shutdown returns ctx.Err() and the engine finishes closing in
// the background when the last call returns. It is idempotent: later calls
// wait the same way and return the first close's result.
func (e *Engine) Shutdown(ctx context.Context) error { return e.c.Shutdown(ctx) }

// Call describes the execution a fn belongs to (idemcore.Call: Key, Attempt,
// Recovered); CallFrom reads it from fn's context.
type Call = idemcore.Call

// CallFrom returns the Call that ctx belongs to, if ctx is (derived from) the
// context given to fn by Do or DoTx, of any engine.
func CallFrom(ctx context.Context) (Call, bool) { return idemcore.CallFrom(ctx) }
