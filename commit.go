package idem

import (
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/idemkit/idem/internal/fault"
	"github.com/idemkit/idem/internal/goid"
)

// The commit pipeline, the bbolt engine's write path: a commit pipeline in which
// concurrent writers share bbolt write transactions (group commit).
//
// One writer at a time: a caller that finds the pipeline idle commits its own
// request on its own goroutine (a lone caller pays no handoff, and no delay,
// unlike bbolt's Batch whose timer costs it up to MaxBatchDelay); requests
// that arrive meanwhile queue, and the committer goroutine takes them all in
// the next commit, so under load one fsync serves many calls.
//
// bbolt has no savepoints: when a request's function fails or panics, the
// whole transaction is rolled back, that request gets its own error, and the
// others are run again in fresh transactions. A function may therefore run
// more than once (at most maxRuns times) and must touch nothing but the
// transaction it is given.
//
// A panic on the committer goroutine outside a request's function (the
// failpoints commit-shared-before and commit-shared-after, or a bug of this
// package) is not recovered: like any unrecovered panic on a goroutine of its
// own, it ends the process, and no caller of the shared commit is answered.
// The file then holds that commit or not (after tx.Commit it does; before, the
// clean-up that unwinds with the panic hands the requests back to a new
// committer, which may commit them before the process exits), as after a
// SIGKILL around a commit: callers never answered, records as committed. A
// panic inside a request's function (a DoTx fn, the failpoints do-done-commit
// and dotx-before-commit) is recovered: it fails that request only, with a
// *commitPanic, and the others of the batch run again without it. The crash
// matrix (idemtest) runs both.

// errPipelineStopped is returned by Do after Stop.
var errPipelineStopped = errors.New("commit pipeline stopped")

// errCommitFailed is wrapped, beside the cause, by the error of a commit that failed
// to write or sync the file, and by every Do after it: the kernel may have
// dropped the pages it could not write, so what the file holds is unknown and
// the pipeline refuses to commit again (it fails closed, as PostgreSQL does
// after an fsync error). Only a new pipeline, on a reopened file, commits
// again. bbolt's ErrMaxSizeReached is not such a failure: it is raised before
// anything is written, and the pipeline goes on.
var errCommitFailed = errors.New("commit failed")

// errCommitGoexit is the error of a request whose function called runtime.Goexit
// (t.FailNow does): its transaction is rolled back and the other requests of
// the batch are committed without it.
var errCommitGoexit = errors.New("commit: function called runtime.Goexit")

// maxRuns is the most times one request's function runs. A function that
// has run maxRuns-1 times in transactions rolled back for others' failures
// runs its last time in a transaction of its own, so no other function's
// failure can roll it back again; whatever it returns then is its outcome.
// DESIGN.md: "no fn runs more than 3 times per call, whatever fails around
// it".
const maxRuns = 3

// commitFunc writes into tx. A non-nil error rolls back every write of its batch;
// the pipeline re-runs the other functions of the batch without it.
type commitFunc func(tx *bbolt.Tx) error

// commitPanic is the error a commitFunc's panic becomes, with its value and the stack
// of the goroutine that panicked. The engine re-raises it in the caller.
type commitPanic struct {
	Value any
	Stack []byte
}

func (p *commitPanic) Error() string { return fmt.Sprintf("panic: %v\n\n%s", p.Value, p.Stack) }

// pipeline serialises writers into shared transactions.
type pipeline struct {
	db       *bbolt.DB
	onCommit func()

	mu      sync.Mutex
	queue   []*request
	spare   []*request
	busy    bool // a commit is running, on a caller or on the committer
	stopped bool
	failed  error // the first failed commit's error, wrapping errCommitFailed

	// writer is the id of the goroutine that runs the functions of the
	// current commit, 0 when none: a call from inside one is re-entrant.
	writer atomic.Uint64

	wake chan struct{}
	quit chan struct{}
	done chan struct{}

	commits  atomic.Uint64
	requests atomic.Uint64

	// Observe, if set before the first Do, is called on the committing
	// goroutine after every successful commit with the requests it carried
	// and the time tx.Commit took, fsync included. It must not block.
	Observe func(requests int, d time.Duration)
}

type request struct {
	fn   commitFunc
	err  error
	runs int // times fn ran, in transactions of any batch
	done chan struct{}
}

// New starts a pipeline over db. onCommit, if not nil, runs on the committer
// after every successful commit (it must not block).
func newPipeline(db *bbolt.DB, onCommit func()) *pipeline {
	p := &pipeline{
		db:       db,
		onCommit: onCommit,
		wake:     make(chan struct{}, 1),
		quit:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	go p.loop()
	return p
}

var requestPool = sync.Pool{New: func() any { return &request{done: make(chan struct{}, 1)} }}

// Do runs fn in a write transaction shared with other callers and returns once
// that transaction has committed (and synced, unless the DB is NoSync), or the
// error of fn, of the commit, or errPipelineStopped.
func (p *pipeline) Do(fn commitFunc) error {
	r := requestPool.Get().(*request)
	r.fn, r.err, r.runs = fn, nil, 0
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		requestPool.Put(r)
		return errPipelineStopped
	}
	if err := p.failed; err != nil {
		p.mu.Unlock()
		requestPool.Put(r)
		return err
	}
	if !p.busy && len(p.queue) == 0 {
		// Idle: commit on this goroutine.
		p.busy = true
		p.mu.Unlock()
		p.runAndRelease([]*request{r})
	} else {
		p.queue = append(p.queue, r)
		idle := !p.busy
		p.mu.Unlock()
		if idle {
			p.signal()
		}
	}
	<-r.done
	err := r.err
	r.fn, r.err = nil, nil
	requestPool.Put(r)
	return err
}

// Stop commits what is queued, stops the committer and waits for it. Later
// calls of Do return errPipelineStopped. Stop is idempotent.
func (p *pipeline) Stop() {
	p.mu.Lock()
	if !p.stopped {
		p.stopped = true
		close(p.quit)
	}
	p.mu.Unlock()
	<-p.done
}

// Failed returns the error of the commit that failed the pipeline (it wraps
// errCommitFailed and the cause), or nil while commits succeed.
func (p *pipeline) Failed() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failed
}

// fail records a failed commit's error and returns the error its requests
// get: the first failure's, so every caller sees the one cause.
func (p *pipeline) fail(err error) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failed == nil {
		p.failed = fmt.Errorf("%w: %w", errCommitFailed, err)
	}
	return p.failed
}

// Stats reports the commits made and the requests they carried.
func (p *pipeline) Stats() (commits, requests uint64) {
	return p.commits.Load(), p.requests.Load()
}

func (p *pipeline) signal() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// release ends a commit and hands what queued meanwhile to the committer.
func (p *pipeline) release() {
	p.mu.Lock()
	p.busy = false
	wake := len(p.queue) > 0 || p.stopped // Stop may be waiting for this commit
	p.mu.Unlock()
	if wake {
		p.signal()
	}
}

// Holding reports whether the calling goroutine is running a function of
// the current commit: a Do from there would wait for itself.
func (p *pipeline) Holding() bool {
	w := p.writer.Load()
	return w != 0 && w == goid.ID()
}

// runAndRelease runs batch and releases the writer, also when a function
// calls runtime.Goexit on this goroutine.
func (p *pipeline) runAndRelease(batch []*request) {
	defer p.release()
	p.run(batch)
}

func (p *pipeline) loop() {
	exited := true
	defer func() {
		if exited {
			// A function called runtime.Goexit on the committer: this
			// goroutine ends, another takes over.
			go p.loop()
			return
		}
		close(p.done)
	}()
	for {
		select {
		case <-p.wake:
		case <-p.quit:
			// Stopped: Do refuses new requests; wait for a caller's commit,
			// then one last drain empties the queue.
			for {
				batch, ok := p.take()
				if ok {
					p.runAndRelease(batch)
					exited = false
					return
				}
				<-p.wake
			}
		}
		if batch, ok := p.take(); ok {
			p.runAndRelease(batch)
		}
	}
}

// take claims the writer and swaps the queue out, reusing the previous
// batch's backing array. ok is false while a caller commits (its release
// signals the committer again).
func (p *pipeline) take() (batch []*request, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.busy {
		return nil, false
	}
	p.busy = true
	batch = p.queue
	p.queue, p.spare = p.spare[:0], nil
	return batch, true
}

func (p *pipeline) run(batch []*request) {
	if len(batch) == 0 {
		return
	}
	p.writer.Store(goid.ID())
	var (
		tx      *bbolt.Tx
		pending = batch
		current *request // the request whose function runs
		normal  bool
	)
	defer func() {
		p.writer.Store(0)
		if !normal {
			// runtime.Goexit in current's function: roll back, fail it,
			// and put the others back at the head of the queue.
			if tx != nil {
				_ = tx.Rollback()
			}
			var rest []*request
			for _, r := range pending {
				if r != current {
					rest = append(rest, r)
				}
			}
			p.mu.Lock()
			p.queue = append(rest, p.queue...)
			p.mu.Unlock()
			if current != nil {
				finish([]*request{current}, errCommitGoexit)
			}
		}
		clear(batch)
		p.mu.Lock()
		if p.spare == nil && normal {
			p.spare = batch[:0]
		}
		p.mu.Unlock()
	}()
	// Each transaction takes a prefix of pending. When a function fails, the
	// transaction rolls back and the failing request gets its error; the
	// requests before it, which ran clean, run again in a transaction of
	// their own (deterministic functions then commit on their second run),
	// and the rest follow. A request on its last run (maxRuns) runs alone.
	upTo := len(pending)
	for len(pending) > 0 {
		group := pending[:groupSize(pending, upTo)]
		var err error
		if err = p.Failed(); err != nil {
			// An earlier commit failed: nothing more is written.
			finish(pending, err)
			break
		}
		if tx, err = p.db.Begin(true); err != nil {
			tx = nil
			finish(pending, err)
			break
		}
		failed := -1
		for i, r := range group {
			current = r
			r.runs++
			if err := call(r.fn, tx); err != nil {
				r.err, failed = err, i
				break
			}
		}
		current = nil
		if failed >= 0 {
			_ = tx.Rollback()
			tx = nil
			r := pending[failed]
			pending = append(pending[:failed:failed], pending[failed+1:]...)
			finish([]*request{r}, r.err)
			upTo = failed
			continue
		}
		// Failpoints of a commit shared by several callers (only the
		// committer goroutine runs one): an error before it stands for a
		// write that failed, after it for an fsync error reported once the
		// pages reached the file; both fail the pipeline closed.
		shared := len(group) > 1
		if shared {
			if err = fault.Err("commit-shared-before"); err != nil {
				_ = tx.Rollback()
			}
		}
		t0 := p.observeStart()
		if err == nil {
			err = commit(tx)
			if err == nil && shared {
				err = fault.Err("commit-shared-after")
			}
		}
		p.observe(t0, len(pending), err)
		tx = nil
		if err != nil && !errors.Is(err, bolterrors.ErrMaxSizeReached) {
			err = p.fail(err)
		}
		p.commits.Add(1)
		p.requests.Add(uint64(len(group)))
		if err != nil {
			finish(pending, err)
			break
		}
		finish(group, nil)
		if p.onCommit != nil {
			p.onCommit()
		}
		pending = pending[len(group):]
		upTo = len(pending)
	}
	normal = true
}

// groupSize is how many requests at the head of pending the next
// transaction takes: at most upTo (all, if upTo is 0), stopping before a
// request on its last run, which takes a transaction alone.
func groupSize(pending []*request, upTo int) int {
	n := upTo
	if n <= 0 || n > len(pending) {
		n = len(pending)
	}
	for i, r := range pending[:n] {
		if r.runs >= maxRuns-1 {
			return max(i, 1)
		}
	}
	return n
}

// commit commits tx, turning a panic of bbolt's (it asserts on a damaged
// file) into an error after rolling back.
func commit(tx *bbolt.Tx) (err error) {
	defer func() {
		if v := recover(); v != nil {
			_ = tx.Rollback()
			err = &commitPanic{Value: v, Stack: debug.Stack()}
		}
	}()
	return tx.Commit()
}

func finish(rs []*request, err error) {
	for _, r := range rs {
		r.err = err
		r.done <- struct{}{}
	}
}

// call runs fn, turning a panic into a *commitPanic.
func call(fn commitFunc, tx *bbolt.Tx) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &commitPanic{Value: v, Stack: debug.Stack()}
		}
	}()
	return fn(tx)
}

// observeStart is when a commit starts, for Observe: zero without it.
func (p *pipeline) observeStart() time.Time {
	if p.Observe == nil {
		return time.Time{}
	}
	return time.Now()
}

// observe reports a successful commit of n requests that started at t0.
func (p *pipeline) observe(t0 time.Time, n int, err error) {
	if p.Observe != nil && err == nil {
		p.Observe(n, time.Since(t0))
	}
}
