package idem

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/idemkit/idem/internal/fault"
	"github.com/idemkit/idem/internal/goid"
)

// The write-ahead journal in front of bbolt (issue 20): a Do's started and
// done records are made durable by one append and one fdatasync each, to a
// preallocated segment file (segment.go), instead of a bbolt commit each
// (two fsyncs: the data pages, then the meta page). bbolt is brought up to
// date behind the journal in large, normally synced commits (checkpoint.go);
// until then readers find the acknowledged writes in the overlay
// (overlay.go). Open replays what the checkpoint does not cover (replay.go).
//
// Group commit: concurrent callers' writes share one frame and one
// fdatasync. A caller that finds the journal idle writes its group on its
// own goroutine (a lone caller pays no handoff); callers that arrive
// meanwhile queue, and a goroutine of the journal's takes them all in the
// next frame. Each caller's function runs against the state it would see
// alone (bbolt, the overlay, then the writes of the callers before it in
// the group); one that fails is dropped alone, its writes with it, and the
// others are not run again (the journal keeps each caller's writes apart,
// as bbolt, without savepoints, cannot).
//
// Order is the proof of durability: a frame is written only after the one
// before it is synced, so a valid frame proves every frame before it
// durable, and a bad frame followed by a later valid one is damage
// (ErrCorrupt), never a torn tail.
//
// What goes through the journal: the record writes of Do (Claim, Complete,
// Release) and DoTx's (RunTx: fn's writes to its buckets through the
// engine's Bucket, bucketview.go, the outbox messages it enqueues, and the
// done record). Every other write (the outbox dispatcher's, the operator's,
// the pruner's) is a direct bbolt commit through the commit pipeline
// (commit.go), made after the overlay is drained into bbolt and never beside
// a journal group (mode), so it reads and writes bbolt as if there were no
// journal.
//
// Without fsync (BoltOptions.NoSync) or under BoltOptions.MaxSize the
// journal is off and Do commits to bbolt as before: a write the journal
// acknowledged must never meet a full file at the checkpoint, and only a
// bbolt commit made before the answer knows whether the file has room.

// errJournalPanic fails the journal closed after a panic outside a caller's
// function (an injected one, or a bug): what the segment holds is unknown.
var errJournalPanic = errors.New("journal: panic while writing a frame")

// journalFunc makes a caller's writes through w. A non-nil error drops them.
type journalFunc func(w *jtx) error

type jreq struct {
	fn       journalFunc
	err      error
	answered bool // finishJ ran: its caller has its answer
	runs     int  // its function's runs (more than one after a Goexit)
	user     bool // a DoTx fn runs in it: the writer's goroutine is marked
	done     chan struct{}
}

// journal is the write-ahead journal of one open file.
type journal struct {
	db   *bbolt.DB
	pipe *pipeline // its failure is the journal's: one fail-closed state
	ov   *overlay
	segs *segments
	id   uint64 // the file's journal id (layout.go)
	salt uint32
	log  *slog.Logger

	// mode orders the journal and direct bbolt writes: a group holds it
	// exclusively, a direct write shared, after draining the overlay.
	mode sync.RWMutex

	wmu     sync.Mutex
	queue   []*jreq
	busy    bool // a group is being written, or a goroutine is about to take one
	stopped bool

	next       uint64 // the sequence number of the next frame; the writer's
	pbuf, fbuf []byte // the writer's buffers

	// writer is the goroutine running the callers' functions (goid), or 0:
	// a DoTx fn calling the engine from there would wait for itself.
	writer  atomic.Uint64
	current *jreq // the request whose function runs; the writer's

	// The checkpoint (checkpoint.go).
	ckMu        sync.Mutex
	ckpt        atomic.Uint64 // the last frame bbolt holds
	kickc       chan struct{}
	urgentc     chan struct{}
	quit, done  chan struct{}
	delay       atomic.Int64 // catchUpDelay, in nanoseconds (tests set it)
	groups      atomic.Uint64
	writes      atomic.Uint64
	checkpoints atomic.Uint64
	waiting     atomic.Int32 // writers waiting for room in the journal

	// Observe, if set before the first write, is called after every frame
	// with the callers it carried and the time its write and sync took.
	Observe func(requests int, d time.Duration)
}

// catchUpDelay is how long the checkpoint lets frames gather after the first
// one it has not covered: its two bbolt fsyncs are shared by every Do of
// the interval. The journal's bound and Close do not wait for it.
const catchUpDelay = 50 * time.Millisecond

// do runs fn's writes in the next frame and returns once the frame is
// durable (its writes in the overlay), or with fn's error, the journal's
// failure, or errPipelineStopped.
func (j *journal) do(fn journalFunc) error { return j.doAs(fn, false) }

// doAs is do; user says that fn runs a DoTx fn, which may call the engine
// (holding).
func (j *journal) doAs(fn journalFunc, user bool) error {
	r := &jreq{fn: fn, done: make(chan struct{}, 1), user: user}
	j.wmu.Lock()
	if j.stopped {
		j.wmu.Unlock()
		return errPipelineStopped
	}
	j.queue = append(j.queue, r)
	lead := !j.busy
	j.busy = true
	j.wmu.Unlock()
	if lead {
		j.lead()
	}
	<-r.done
	return r.err
}

// lead writes the queued requests as one group, then hands what queued
// meanwhile to a goroutine of its own, or ends the writer's turn.
func (j *journal) lead() {
	j.wmu.Lock()
	batch := j.queue
	if len(batch) > 1 && batch[0].runs >= maxRuns-1 {
		// Its function ran twice in groups another's Goexit ended: it runs
		// alone (at most maxRuns runs, as on the commit pipeline).
		batch = batch[:1]
	}
	j.queue = j.queue[len(batch):]
	j.wmu.Unlock()
	j.group(batch)
	j.wmu.Lock()
	more := len(j.queue) > 0
	j.busy = more
	j.wmu.Unlock()
	if more {
		go j.lead()
	}
}

// group runs batch's functions and writes their writes as one frame.
func (j *journal) group(batch []*jreq) {
	j.mode.Lock()
	defer j.mode.Unlock()
	pending := batch
	finished := false
	defer func() {
		v := recover()
		if v == nil && !finished {
			j.goexit(batch)
			return
		}
		if v != nil {
			// A panic outside the functions: fail closed, answer every
			// caller, and let the panic go on (as on the committer).
			err := j.pipe.fail(fmt.Errorf("%w: %v", errJournalPanic, v))
			j.wmu.Lock()
			queued := j.queue
			j.queue, j.busy = nil, false
			j.wmu.Unlock()
			for _, r := range append(pending, queued...) {
				finishJ(r, err)
			}
			panic(v)
		}
	}()
	j.write(batch, &pending)
	finished = true
}

// write is group's work: pending is the requests not answered yet, for a
// panic.
func (j *journal) write(batch []*jreq, pending *[]*jreq) {
	if err := j.pipe.Failed(); err != nil {
		for _, r := range batch {
			finishJ(r, err)
		}
		return
	}
	muts, ok, err := j.run(batch)
	*pending = ok
	if err != nil {
		for _, r := range ok {
			finishJ(r, err)
		}
		return
	}
	if len(muts) > 0 {
		t0 := time.Now()
		if err := j.append(muts); err != nil {
			if !errors.Is(err, bolterrors.ErrMaxSizeReached) {
				err = j.pipe.fail(err)
			}
			for _, r := range ok {
				finishJ(r, err)
			}
			return
		}
		j.groups.Add(1)
		j.writes.Add(uint64(len(ok)))
		if j.Observe != nil {
			j.Observe(len(ok), time.Since(t0))
		}
	}
	for _, r := range ok {
		finishJ(r, nil)
	}
	*pending = nil
}

// goexit answers the request whose function called runtime.Goexit on the
// writer's goroutine, and hands the rest of its group, not yet written, to
// a goroutine of the journal's, which runs their functions again.
func (j *journal) goexit(batch []*jreq) {
	var again []*jreq
	for _, r := range batch {
		switch {
		case r == j.current:
			finishJ(r, errCommitGoexit)
		case !r.answered:
			again = append(again, r)
		}
	}
	// Those that ran twice first: each runs alone (lead).
	slices.SortStableFunc(again, func(a, b *jreq) int { return cmp.Compare(b.runs, a.runs) })
	j.current = nil
	j.wmu.Lock()
	j.queue = append(again, j.queue...)
	more := len(j.queue) > 0
	j.busy = more
	j.wmu.Unlock()
	if more {
		go j.lead()
	}
}

// run runs the functions of batch in order, each over the writes of those
// before it, and returns the writes of those that succeeded and their
// requests; a request whose function failed is answered at once.
func (j *journal) run(batch []*jreq) (muts []mutation, ok []*jreq, err error) {
	j.ov.mu.RLock()
	defer j.ov.mu.RUnlock()
	tx, err := j.db.Begin(false)
	if err != nil {
		return nil, batch, err
	}
	defer func() { _ = tx.Rollback() }()
	for _, r := range batch {
		if r.user {
			// A DoTx fn may call the engine: mark this goroutine (Holding).
			// Do's record writes, which call nothing, spare the cost.
			j.writer.Store(goid.ID())
			defer j.writer.Store(0)
			break
		}
	}
	w := &jtx{ov: j.ov, tx: tx, pend: newOverlay()}
	ok = batch[:0:0]
	for _, r := range batch {
		w.muts, w.own = nil, nil
		j.current = r
		r.runs++
		if err := callJournal(r.fn, w); err != nil {
			finishJ(r, err)
			continue
		}
		w.pend.apply(0, w.muts)
		muts = append(muts, w.muts...)
		ok = append(ok, r)
	}
	return muts, ok, nil
}

func finishJ(r *jreq, err error) {
	r.err, r.answered = err, true
	r.done <- struct{}{}
}

// holding reports whether the calling goroutine runs a caller's function.
func (j *journal) holding() bool {
	w := j.writer.Load()
	return w != 0 && w == goid.ID()
}

// callJournal runs fn, turning a panic into a *commitPanic.
func callJournal(fn journalFunc, w *jtx) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &commitPanic{Value: v, Stack: debug.Stack()}
		}
	}()
	return fn(w)
}

// append writes muts as the next frame and syncs it, then applies them to
// the overlay. When the journal is full it waits for the checkpoint to free
// a segment; a frame larger than a segment is committed to bbolt directly.
func (j *journal) append(muts []mutation) error {
	seq := j.next
	j.pbuf = appendBatch(j.pbuf[:0], muts)
	if frameSize(len(j.pbuf)) > int(j.segs.size) {
		return j.direct(seq, muts)
	}
	j.fbuf = appendFrame(j.fbuf[:0], j.salt, seq, j.pbuf)
	var (
		s   *segment
		off int64
	)
	for {
		var (
			freed uint64
			err   error
		)
		s, off, freed, err = j.segs.reserve(len(j.fbuf), seq)
		if err != nil {
			return err
		}
		if s != nil {
			break
		}
		j.waiting.Add(1)
		j.kick(true) // full: the callers wait for the checkpoint
		j.segs.wait(freed)
		j.waiting.Add(-1)
		if err := j.pipe.Failed(); err != nil {
			return err // the checkpoint failed: no room will come
		}
	}
	if err := fault.Err("journal-before-write"); err != nil {
		return err // as a write that failed
	}
	if _, err := s.f.WriteAt(j.fbuf, off); err != nil {
		return err
	}
	if err := fault.Err("journal-before-sync"); err != nil {
		return err // as a sync that failed
	}
	if err := fdatasync(s.f); err != nil {
		return err
	}
	j.next++
	if err := fault.Err("journal-after-sync"); err != nil {
		return err // as a sync error reported once the frame reached the disk
	}
	j.ov.mu.Lock()
	j.ov.apply(seq, muts)
	j.ov.mu.Unlock()
	j.kick(false)
	return nil
}

// direct commits muts to bbolt in place of frame seq, after the overlay is
// drained into bbolt, with the checkpoint at seq.
func (j *journal) direct(seq uint64, muts []mutation) error {
	if err := j.catchUp(); err != nil {
		return err
	}
	err := update(j.db, func(tx *bbolt.Tx) error {
		for _, m := range muts {
			if err := applyOrdered(tx, m); err != nil {
				return err
			}
		}
		return putJournalMeta(tx, j.id, seq)
	})
	if err != nil {
		return err
	}
	j.next++
	j.ckpt.Store(seq)
	j.segs.release(seq)
	return nil
}

// drain brings bbolt up to date with every frame written so far, for a
// direct write, Backup and Close.
func (j *journal) drain() error { return j.catchUp() }

// directWrite runs a direct bbolt write (the commit pipeline's): never
// beside a journal group, and after the overlay is drained into bbolt, so
// that write reads and writes bbolt as it would without a journal.
func (j *journal) directWrite(write func() error) error {
	j.mode.RLock()
	defer j.mode.RUnlock()
	if !j.ov.empty() {
		if err := j.drain(); err != nil {
			return err
		}
	}
	return write()
}

// stats reports the frames written and the callers' writes they carried.
func (j *journal) stats() (groups, writes uint64) { return j.groups.Load(), j.writes.Load() }

// close waits for the writer, refuses later writes, drains the overlay into
// bbolt (unless the journal failed) and closes the segments.
func (j *journal) close() error {
	j.wmu.Lock()
	j.stopped = true
	j.wmu.Unlock()
	j.mode.Lock() // a group in flight ends first
	close(j.quit)
	<-j.done
	var err error
	if j.pipe.Failed() == nil {
		err = j.drain()
	}
	if cerr := j.segs.close(err == nil && j.pipe.Failed() == nil); err == nil {
		err = cerr
	}
	j.mode.Unlock()
	return err
}

// jtx is a caller's view of the records inside a journal group: its own
// writes, then the group's before it, then the overlay, then bbolt's read
// transaction. A DoTx fn's view of its buckets (view) is the same layers.
type jtx struct {
	ov   *overlay
	tx   *bbolt.Tx
	pend *overlay
	muts []mutation
	own  *overlay // the caller's DoTx writes, made at its first view
}

// view returns the caller's view of the user buckets and the outbox.
func (w *jtx) view() *uview {
	if w.own == nil {
		w.own = newOverlay()
	}
	return &uview{tx: w.tx, layers: []*overlay{w.ov, w.pend, w.own},
		emit: func(m mutation) { w.muts = append(w.muts, m) }}
}

func (w *jtx) get(bucket, key []byte) []byte {
	for i := len(w.muts) - 1; i >= 0; i-- {
		if m := &w.muts[i]; m.op == 0 && bytes.Equal(m.key, key) && bytes.Equal(m.bucket, bucket) {
			return m.value
		}
	}
	if e := w.pend.get(bucket, key); e != nil {
		return e.value
	}
	if e := w.ov.get(bucket, key); e != nil {
		return e.value
	}
	return boltGet(w.tx, bucket, key)
}

// put takes bucket, key and value as they are: the caller gives them up.
func (w *jtx) put(bucket, key, value []byte) error {
	w.muts = append(w.muts, mutation{bucket: bucket, key: key, value: value})
	return nil
}

func (w *jtx) del(bucket, key []byte) error {
	w.muts = append(w.muts, mutation{bucket: bucket, key: key, del: true})
	return nil
}
