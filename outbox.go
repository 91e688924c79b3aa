package idem

import (
	"bytes"
	"cmp"
	"container/heap"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"math/rand/v2"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"go.etcd.io/bbolt"

	"github.com/idemkit/idem/internal/core"
	"github.com/idemkit/idem/internal/fault"
	"github.com/idemkit/idem/internal/layout"
)

// Defaults for the zero values of OutboxOptions, each named DefaultOutbox and
// its field.
const (
	// DefaultOutboxWorkers bounds the handlers running at once.
	DefaultOutboxWorkers = 16
	// DefaultOutboxBaseBackoff is the wait after a message's first failed attempt.
	DefaultOutboxBaseBackoff = time.Second
	// DefaultOutboxMaxBackoff caps the wait between two attempts.
	DefaultOutboxMaxBackoff = 10 * time.Minute
	// DefaultOutboxMaxAttempts is the number of failed attempts after which a
	// message becomes a dead letter. With the default backoff, the last
	// attempt comes between about 53 minutes and 1 hour 47 minutes after the
	// first.
	DefaultOutboxMaxAttempts = 20
	// DefaultOutboxDeadLetterRetention is how long a dead letter is kept.
	DefaultOutboxDeadLetterRetention = 7 * 24 * time.Hour
	// DefaultOutboxPollInterval is the longest the dispatcher sleeps while a
	// message waits for its backoff.
	DefaultOutboxPollInterval = time.Second
)

const (
	maxTopicLen   = 255  // bytes, as for keys
	maxLastErrLen = 4096 // bytes of a handler's error kept with the message
)

// OutboxOptions configure the outbox dispatcher (see Tx.Enqueue). The zero
// value of every field means its default.
type OutboxOptions struct {
	// Dispatch starts the dispatcher at Open, in the background, until Close
	// (never on a ReadOnly open). False (the default) leaves the messages in
	// the file, for a later Open with Dispatch set (or for `idem outbox`).
	// The dispatcher delivers the outbox's messages to their handlers, at
	// least once each:
	//
	//   - In enqueue order per ordering key, one at a time: a message is
	//     handed to its handler only after the previous one of its ordering
	//     key was delivered and removed, or died. A message waiting for its
	//     retry, or for a handler, holds back the later ones of its key; a
	//     dead letter does not (they overtake it). Messages of different
	//     ordering keys run in parallel, up to Workers.
	//   - A handler's error retries the message after an exponential backoff
	//     with jitter (BaseBackoff, MaxBackoff); after MaxAttempts failed
	//     attempts it becomes a dead letter (Engine.Messages, RetryDead,
	//     DropDead).
	//   - A delivered message is removed in a commit of its own; if the
	//     process dies between the handler's return and that commit, the
	//     message is delivered again after the restart, with the same
	//     DownstreamKey.
	//
	// It wakes on every commit, so a message is dispatched right after the
	// DoTx that enqueued it commits. Close cancels the context of running
	// handlers and waits for them.
	Dispatch bool

	// Handlers are the handlers by topic, fixed at Open (the map is copied).
	// Messages of a topic without a handler wait in the outbox
	// (OutboxStats.Waiting), holding back the later messages of their
	// ordering key, until an Open with a handler for it.
	Handlers map[string]Handler

	// Workers bounds the handlers running at once (of different ordering
	// keys: the messages of one ordering key are delivered one at a time).
	// Zero means DefaultOutboxWorkers.
	Workers int

	// BaseBackoff is the wait after a message's first failed attempt; it
	// doubles after each further failure, up to MaxBackoff (raised to
	// BaseBackoff if lower). Each wait w is jittered uniformly into
	// [w/2, w). Wall-clock, measured with Options.Now. Zero means
	// DefaultOutboxBaseBackoff and DefaultOutboxMaxBackoff respectively.
	BaseBackoff, MaxBackoff time.Duration

	// MaxAttempts is the number of failed attempts after which a message
	// becomes a dead letter. Zero means DefaultOutboxMaxAttempts; a negative value
	// retries forever.
	MaxAttempts int

	// DeadLetterRetention is how long a dead letter is kept after it died
	// (wall-clock, Options.Now) before the pruner deletes it; like
	// Options.Retention it is a floor, and an expired dead letter is absent
	// to Messages and RetryDead at once. Zero means
	// DefaultOutboxDeadLetterRetention. It is recorded with each dead letter when it
	// dies (Message.DeadLetterRetention): a later Open with a shorter one, or
	// `idem prune`, does not expire it early; a longer one lengthens it.
	DeadLetterRetention time.Duration

	// PollInterval is the longest the dispatcher sleeps (real time) while a
	// message waits for its backoff; it wakes at once on every commit. Zero
	// means DefaultOutboxPollInterval.
	PollInterval time.Duration
}

// OutboxStats counts outbox messages, as Engine.ScanFile returns them (FileStats.Outbox).
type OutboxStats struct {
	// Pending counts the messages not delivered yet and not dead: the
	// outbox's length. Retrying and Waiting are among them.
	Pending int
	// Retrying counts the pending messages that have failed at least once.
	Retrying int
	// Waiting counts the pending messages whose topic has no handler in this
	// engine (a tool that registers no handlers sees every message waiting).
	Waiting int
	// Dead counts the dead letters inside their retention.
	Dead int
	// Corrupt counts the messages, pending or dead, that fail to decode.
	Corrupt int
	// Delivered counts the messages delivered and removed since Open.
	Delivered uint64
}

// Handler delivers one outbox message to the system it is for: a payment
// gateway, a mailer. It runs outside any transaction, on the dispatcher's
// worker goroutines, and may do I/O. It returns nil once the effect is done
// (the message is then removed), or an error to retry the message after a
// backoff. Delivery is at least once: a message may reach its handler again
// after a crash or a failed removal, so pass m.DownstreamKey on as the
// downstream system's idempotency key. ctx is cancelled on Close and when
// Dispatch's ctx ends; an error returned then does not count as an attempt.
// A panic counts as a failed attempt. A handler must not call Close.
type Handler func(ctx context.Context, m Message) error

// Message is an outbox message: as given to a Handler, and as listed by
// Engine.Messages. The type is the state machine's (internal/core), shared by
// every backend; its fields:
//
//   - Seq names the message in the file (RetryDead, DropDead, the CLI): it is
//     unique and increases in enqueue order.
//   - Topic selects the handler.
//   - Key is the idempotency key of the DoTx call that enqueued the message,
//     Index its position among the messages of that call, from 0.
//   - DownstreamKey is DownstreamKey(Key, Index): the key to pass on to the
//     downstream system. Retries of the message reuse it; other messages
//     never share it.
//   - OrderingKey groups the messages delivered in enqueue order, one at a
//     time: by default Key, else the one given to Tx.EnqueueOrdered.
//   - Payload is the bytes given to Enqueue (nil and empty differ). The
//     handler owns its copy.
//   - Attempt is, in a handler, the delivery attempt in progress: 1 on the
//     first delivery, Failures+1. Zero in Messages.
//   - Failures counts the failed delivery attempts recorded so far (a
//     handler's error or panic); an attempt cut short by a crash or by the
//     end of Dispatch is not counted. RetryDead resets it to 0.
//   - EnqueuedAt is when the call enqueued it (engine clock); NextAttemptAt
//     when a message that failed may be tried again (zero for at once).
//   - LastError is the text of the last failed attempt's error (its first 4
//     KiB), empty if none.
//   - Dead is true for a dead letter, DeadAt when it died (engine clock).
//   - DeadLetterRetention is the OutboxOptions.DeadLetterRetention in force
//     when the message died, recorded with it: a dead letter lives at least
//     this long after DeadAt (or a later Open's longer retention), whatever a
//     later Open passes. Zero for a message that is not dead, and for a dead
//     letter that died before the file recorded it (format version 1), which
//     lives at least DefaultOutboxDeadLetterRetention.
type Message = core.Message

// DownstreamKey is the key a message passes on to the downstream system
// (Message.DownstreamKey): key + "/" + index, for example "order-42/0". If
// that would exceed MaxKeyLen bytes (Stripe's limit, so it stays usable as an
// Idempotency-Key header), it is "sha256:" + the hex SHA-256 of key + "/" +
// index instead: 72 bytes and the digits of index. Either way it is a
// function of key and index only, so every attempt of a message, in any
// process, passes the same key, and two messages of one call never share one.
func DownstreamKey(key string, index int) string {
	s := key + "/" + strconv.Itoa(index)
	if len(s) <= MaxKeyLen {
		return s
	}
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:]) + "/" + strconv.Itoa(index)
}

// Enqueue stores a message for topic's handler in the outbox, in fn's
// transaction: it commits with the call's record and fn's writes, or not at
// all. Its ordering key is the call's idempotency key. payload is stored as
// given (copied). The message is delivered after the commit, at least once,
// after the messages enqueued before it with the same ordering key. topic is
// 1 to 255 bytes of UTF-8, else ErrInvalidMessage.
func (t *Tx) Enqueue(topic string, payload []byte) error {
	return t.EnqueueOrdered(topic, "", payload)
}

// EnqueueOrdered is Enqueue with another ordering key, for example an order
// id, so that messages of different calls about one thing are delivered in
// the order they were enqueued (a refund never overtakes its charge). An empty
// orderingKey means the call's idempotency key. orderingKey is at most
// MaxKeyLen bytes of UTF-8, else ErrInvalidMessage.
func (t *Tx) EnqueueOrdered(topic, orderingKey string, payload []byte) error {
	if t.tx == nil {
		return &OpError{Op: "enqueue", Key: t.key, Err: ErrTxClosed}
	}
	switch {
	case topic == "" || len(topic) > maxTopicLen || !utf8.ValidString(topic):
		return &OpError{Op: "enqueue", Key: t.key, Err: fmt.Errorf("%w: topic must be 1 to %d bytes of UTF-8", ErrInvalidMessage, maxTopicLen)}
	case len(orderingKey) > MaxKeyLen || !utf8.ValidString(orderingKey):
		return &OpError{Op: "enqueue", Key: t.key, Err: fmt.Errorf("%w: ordering key must be at most %d bytes of UTF-8", ErrInvalidMessage, MaxKeyLen)}
	}
	if orderingKey == "" {
		orderingKey = t.key
	}
	m := &Message{Topic: topic, Key: t.key, Index: t.msgs, OrderingKey: orderingKey,
		Payload: payload, EnqueuedAt: t.e.now()}
	if err := t.e.b.Enqueue(t, m); err != nil {
		return &OpError{Op: "enqueue", Key: t.key, Err: err}
	}
	t.msgs++
	return nil
}

// Messages calls fn for every message in the file, in one read transaction:
// the pending ones in enqueue order, then the dead letters inside their
// retention, by Seq. A message that fails to decode is passed with only Seq
// and Dead set and an error wrapping ErrCorrupt. An error from fn stops the
// walk and is returned. fn runs inside the read transaction: any engine call
// from it (on its goroutine), RetryDead and DropDead included, returns
// ErrReentrant, since a write would wait for the transaction to end (collect
// the Seqs, then act); fn must not call Close. Under ReadOnly, Messages
// works; RetryDead and DropDead fail.
func (e *Engine) Messages(fn func(m *Message, err error) error) error {
	if err := e.enterOp(); err != nil {
		return &OpError{Op: "messages", Err: err}
	}
	defer e.exitOp()
	now := e.now()
	var fnErr error // fn's own error, returned as it is
	err := e.b.Messages(context.Background(), func(m *Message, err error) error {
		if err != nil {
			err = opError("messages", "", err)
		} else if m.Dead && e.deadExpired(m, now) {
			return nil
		}
		fnErr = fn(m, err)
		return fnErr
	})
	if err != nil && err == fnErr {
		return err
	}
	return opError("messages", "", err)
}

// RetryDead puts dead letter seq back in the outbox at its old place: its
// attempt count starts again from 0, and as the oldest message of its
// ordering key it is delivered before that key's later pending messages. It
// fails with ErrMessageNotFound if seq is not a dead letter (or expired), with
// ErrCorrupt if it does not decode. Like every engine call, it returns
// ErrReentrant from inside a DoTx fn (which holds the writer).
func (e *Engine) RetryDead(seq uint64) error {
	err := e.operateDead("retry dead", func() error {
		return e.b.RetryDead(context.Background(), seq, func(m *Message) error {
			if e.deadExpired(m, e.now()) {
				return fmt.Errorf("%w: message %d (expired)", ErrMessageNotFound, seq)
			}
			m.Failures, m.NextAttemptAt, m.Dead, m.DeadAt, m.DeadLetterRetention = 0, time.Time{}, false, time.Time{}, 0
			return nil
		})
	})
	if err == nil {
		ob := e.outbox()
		ob.rescan.Store(true)
		ob.signal()
	}
	return err
}

// DropDead deletes dead letter seq, also one that fails to decode. It fails
// with ErrMessageNotFound if seq is not a dead letter.
func (e *Engine) DropDead(seq uint64) error {
	return e.operateDead("drop dead", func() error { return e.b.DropDead(context.Background(), seq) })
}

func (e *Engine) operateDead(op string, fn func() error) error {
	if err := e.enterOp(); err != nil {
		return &OpError{Op: op, Err: err}
	}
	defer e.exitOp()
	if err := fn(); err != nil {
		return e.writeErr(op, "", err)
	}
	return nil
}

// ---- engine plumbing ----

// outbox is the engine's outbox state: the handlers and the dispatcher's
// signals.
type outbox struct {
	opts OutboxOptions // defaults applied

	handlers map[string]Handler // fixed at Open: read without a lock

	wake   chan struct{} // capacity 1: commits, RetryDead
	rescan atomic.Bool   // reload the whole outbox (RetryDead put an old seq back)

	delivered atomic.Uint64
	loops     atomic.Uint64 // passes of the dispatcher's loop: tests count them
}

func (e *Engine) outbox() *outbox { return e.ob }

func (ob *outbox) signal() {
	select {
	case ob.wake <- struct{}{}:
	default:
	}
}

func (ob *outbox) handler(topic string) Handler { return ob.handlers[topic] }

// startOutbox sets up the outbox state and starts the background dispatcher
// if the options ask for it.
func (e *Engine) startOutbox() error {
	o := e.opts.Outbox
	if o.Workers <= 0 {
		o.Workers = DefaultOutboxWorkers
	}
	if o.BaseBackoff <= 0 {
		o.BaseBackoff = DefaultOutboxBaseBackoff
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = DefaultOutboxMaxBackoff
	}
	if o.MaxBackoff < o.BaseBackoff {
		o.MaxBackoff = o.BaseBackoff
	}
	if o.MaxAttempts == 0 {
		o.MaxAttempts = DefaultOutboxMaxAttempts
	}
	if o.DeadLetterRetention <= 0 {
		o.DeadLetterRetention = DefaultOutboxDeadLetterRetention
	}
	if o.PollInterval <= 0 {
		o.PollInterval = DefaultOutboxPollInterval
	}
	ob := &outbox{handlers: make(map[string]Handler, len(o.Handlers)), wake: make(chan struct{}, 1)}
	for topic, h := range o.Handlers {
		if h != nil {
			ob.handlers[topic] = h
		}
	}
	o.Handlers = nil
	ob.opts = o
	e.ob = ob
	if o.Dispatch {
		e.bg.Add(1)
		go func() {
			defer e.bg.Done()
			e.dispatch(e.ctx) // e.ctx ends first thing in Shutdown
		}()
	}
	return nil
}

// committed runs on the committer after every commit: a non-blocking wake-up
// of the dispatcher.
func (e *Engine) committed() {
	if ob := e.outbox(); ob != nil {
		ob.signal()
	}
}

// outboxStats counts the messages in tx for Engine.ScanFile.
func (e *Engine) outboxStats(tx *bbolt.Tx, s *OutboxStats) error {
	ob := e.outbox()
	s.Delivered = ob.delivered.Load()
	now := e.now()
	err := outboxBucket(tx).ForEach(func(k, v []byte) error {
		seq, _ := layout.ParseU64(k)
		m, err := decodeMessage(seq, v)
		if err != nil {
			s.Corrupt++
			return nil
		}
		s.Pending++
		if m.Failures > 0 {
			s.Retrying++
		}
		if ob.handler(m.Topic) == nil {
			s.Waiting++
		}
		return nil
	})
	if err != nil {
		return err
	}
	return deadBucket(tx).ForEach(func(k, v []byte) error {
		seq, _ := layout.ParseU64(k)
		m, err := decodeMessage(seq, v)
		switch {
		case err != nil:
			s.Corrupt++
		case !e.deadExpired(m, now):
			s.Dead++
		}
		return nil
	})
}

// deadExpired reports whether dead letter m is past its retention at now:
// the longer of the one it died under (DefaultOutboxDeadLetterRetention if the file
// did not record it) and this engine's.
func (e *Engine) deadExpired(m *Message, now time.Time) bool {
	return !now.Before(m.DeadAt.Add(max(cmp.Or(m.DeadLetterRetention, DefaultOutboxDeadLetterRetention), e.outbox().opts.DeadLetterRetention)))
}

// pruneDeadLetters deletes the dead letters past their retention, in
// transactions of at most pruneBatch; the pruner calls it. Corrupt dead
// letters stay until DropDead. Errors are logged.
func (e *Engine) pruneDeadLetters(ctx context.Context, now time.Time) {
	for ctx.Err() == nil {
		var seqs [][]byte
		_ = e.db.View(func(tx *bbolt.Tx) error {
			c := deadBucket(tx).Cursor()
			for k, v := c.First(); k != nil && len(seqs) < pruneBatch; k, v = c.Next() {
				seq, _ := layout.ParseU64(k)
				if m, err := decodeMessage(seq, v); err == nil && e.deadExpired(m, now) {
					seqs = append(seqs, bytes.Clone(k))
				}
			}
			return nil
		})
		if len(seqs) == 0 {
			return
		}
		err := e.pipe.Do(func(tx *bbolt.Tx) error {
			b := deadBucket(tx)
			for _, k := range seqs {
				if err := b.Delete(k); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			if ctx.Err() == nil {
				e.log.Warn("idem: pruning dead letters failed", "err", err)
			}
			return
		}
		e.log.Debug("idem: pruned expired dead letters", "messages", len(seqs))
		if len(seqs) < pruneBatch {
			return
		}
	}
}

func outboxBucket(tx *bbolt.Tx) *bbolt.Bucket { return rootBucket(tx).Bucket(layout.Outbox) }
func deadBucket(tx *bbolt.Tx) *bbolt.Bucket   { return rootBucket(tx).Bucket(layout.Dead) }

// ---- the dispatcher ----

// dispatcher is the state of one run of the dispatcher. Only its own
// goroutine touches it; workers report through results.
//
// It keeps an index of the outbox in memory: the pending sequence numbers of
// every ordering key, in order. The outbox only grows at its end (bbolt's
// NextSequence, in commit order), so after a commit the dispatcher reads only
// what follows the last sequence it saw; RetryDead, which puts an old sequence
// back, asks for a full reload.
type dispatcher struct {
	e   *Engine
	ob  *outbox
	ctx context.Context // the handlers' context

	queues  map[string]*okQueue // by ordering key
	entries map[uint64]*entry   // by seq
	lastSeq uint64
	gen     uint64 // counts full reloads

	ready   []string            // ordering keys whose head can go now
	timers  timerHeap           // heads waiting for their backoff
	waiting map[string]struct{} // ordering keys whose head has no handler

	busy    int
	results chan result
	wg      sync.WaitGroup
}

type okQueue struct {
	seqs    []uint64 // pending, in enqueue order; seqs[0] is the head
	busy    bool     // the head is with a handler
	gen     uint64   // the reload the busy head was dispatched in
	queued  bool     // the key is in ready
	timerAt time.Time
}

type entry struct {
	ok, topic string
	next      time.Time
}

type result struct {
	seq     uint64
	ok      string
	removed bool      // delivered, dead or gone: off the queue
	retryAt time.Time // else: when to try again (zero: stopping)
}

func (e *Engine) dispatch(ctx context.Context) {
	ob := e.outbox()
	d := &dispatcher{e: e, ob: ob, ctx: ctx, results: make(chan result, ob.opts.Workers)}
	defer d.wg.Wait()
	ob.rescan.Store(true)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	load := true
	for {
		ob.loops.Add(1)
		if load {
			load = false
			d.load()
		}
		d.fireTimers()
		d.dispatchReady()

		var tick <-chan time.Time
		if len(d.timers) > 0 {
			wait := min(d.timers[0].at.Sub(e.now()), ob.opts.PollInterval)
			timer.Reset(max(wait, 0))
			tick = timer.C
		}
		select {
		case <-ctx.Done():
			return
		case <-ob.wake:
			load = true
		case r := <-d.results:
			d.apply(r)
		case <-tick:
		}
		timer.Stop()
	}
}

// load reads the outbox into the index: all of it on a rescan, else what was
// committed after lastSeq. Messages that fail to decode go to the dead
// letters as they are.
func (d *dispatcher) load() {
	full := d.ob.rescan.Swap(false)
	if full {
		busy := make(map[string]uint64)
		for ok, q := range d.queues {
			if q.busy {
				busy[ok] = q.gen
			}
		}
		d.queues, d.entries, d.lastSeq = make(map[string]*okQueue), make(map[uint64]*entry), 0
		d.ready, d.timers, d.waiting = nil, nil, make(map[string]struct{})
		d.gen++
		for ok, gen := range busy {
			d.queues[ok] = &okQueue{busy: true, gen: gen}
		}
	}
	var corrupt []uint64
	var added []string
	err := d.e.db.View(func(tx *bbolt.Tx) error {
		c := outboxBucket(tx).Cursor()
		k, v := c.First()
		if !full {
			k, v = c.Seek(layout.U64(d.lastSeq + 1))
		}
		for ; k != nil; k, v = c.Next() {
			seq, ok := layout.ParseU64(k)
			if !ok {
				continue
			}
			d.lastSeq = max(d.lastSeq, seq)
			m, err := decodeMessage(seq, v)
			if err != nil {
				corrupt = append(corrupt, seq)
				continue
			}
			q := d.queues[m.OrderingKey]
			if q == nil {
				q = &okQueue{}
				d.queues[m.OrderingKey] = q
			}
			q.seqs = append(q.seqs, seq)
			d.entries[seq] = &entry{ok: m.OrderingKey, topic: m.Topic, next: m.NextAttemptAt}
			if len(q.seqs) == 1 || full {
				added = append(added, m.OrderingKey)
			}
		}
		return nil
	})
	if err != nil {
		d.e.log.Warn("idem: outbox: reading messages failed", "err", err)
		d.ob.rescan.Store(true)
		return
	}
	for _, ok := range added {
		d.consider(ok)
	}
	if len(corrupt) > 0 {
		d.e.quarantine(corrupt)
	}
}

// consider files ordering key ok's head where it belongs: ready, waiting for
// its backoff, or waiting for a handler.
func (d *dispatcher) consider(ok string) {
	q := d.queues[ok]
	if q == nil {
		return
	}
	if len(q.seqs) == 0 {
		if !q.busy {
			delete(d.queues, ok)
		}
		return
	}
	if q.busy || q.queued {
		return
	}
	h := d.entries[q.seqs[0]]
	switch {
	case d.ob.handler(h.topic) == nil:
		d.waiting[ok] = struct{}{}
	case h.next.After(d.e.now()):
		if !q.timerAt.Equal(h.next) {
			q.timerAt = h.next
			heap.Push(&d.timers, timer{at: h.next, ok: ok})
		}
	default:
		q.queued = true
		d.ready = append(d.ready, ok)
	}
}

func (d *dispatcher) fireTimers() {
	now := d.e.now()
	for len(d.timers) > 0 && !d.timers[0].at.After(now) {
		t := heap.Pop(&d.timers).(timer)
		if q := d.queues[t.ok]; q != nil && q.timerAt.Equal(t.at) {
			q.timerAt = time.Time{}
		}
		d.consider(t.ok)
	}
}

// dispatchReady hands ready heads to workers while there are free ones.
func (d *dispatcher) dispatchReady() {
	for d.busy < d.ob.opts.Workers && len(d.ready) > 0 {
		ok := d.ready[0]
		d.ready = d.ready[1:]
		q := d.queues[ok]
		if q == nil {
			continue
		}
		q.queued = false
		if q.busy || len(q.seqs) == 0 {
			d.consider(ok)
			continue
		}
		seq := q.seqs[0]
		h := d.entries[seq]
		handler := d.ob.handler(h.topic)
		if handler == nil || h.next.After(d.e.now()) {
			d.consider(ok)
			continue
		}
		var m *Message
		var err error
		_ = d.e.db.View(func(tx *bbolt.Tx) error {
			v := outboxBucket(tx).Get(layout.U64(seq))
			if v == nil {
				err = errGone
				return nil
			}
			m, err = decodeMessage(seq, v)
			return nil
		})
		if err != nil {
			if err != errGone {
				d.e.quarantine([]uint64{seq})
			}
			d.remove(ok, seq)
			continue
		}
		m.Attempt = m.Failures + 1 // the one in progress
		q.busy, q.gen = true, d.gen
		d.busy++
		d.wg.Add(1)
		go d.deliver(handler, *m)
	}
}

var errGone = errors.New("message gone")

// remove takes seq off ok's queue and looks at the next head.
func (d *dispatcher) remove(ok string, seq uint64) {
	delete(d.entries, seq)
	if q := d.queues[ok]; q != nil {
		for i, s := range q.seqs {
			if s == seq {
				q.seqs = append(q.seqs[:i:i], q.seqs[i+1:]...)
				break
			}
		}
	}
	d.consider(ok)
}

func (d *dispatcher) apply(r result) {
	d.busy--
	q := d.queues[r.ok]
	if q == nil {
		return
	}
	q.busy = false
	switch {
	case r.removed:
		d.remove(r.ok, r.seq)
		if q.gen != d.gen {
			// A full reload ran while the message was out: it may have read
			// the seq again, put back by RetryDead after this removal, and
			// remove just dropped it from the index. Read the file again.
			d.ob.rescan.Store(true)
			d.ob.signal()
		}
	case !r.retryAt.IsZero():
		if en := d.entries[r.seq]; en != nil {
			en.next = r.retryAt
		}
		d.consider(r.ok)
	}
}

// deliver runs on a worker goroutine: the handler, then the removal or the
// failed attempt, each in a commit of its own.
func (d *dispatcher) deliver(h Handler, m Message) {
	defer d.wg.Done()
	r := result{seq: m.Seq, ok: m.OrderingKey}
	defer func() { d.results <- r }()
	e := d.e
	if e.pipe.Failed() != nil {
		// Failed closed (ErrStorageFailed): the message may come from a
		// commit that never reached the disk; nothing is delivered until a
		// reopen reads what did.
		r.retryAt = e.now().Add(d.ob.opts.MaxBackoff)
		return
	}
	// An error at a point before or after the handler counts as a failed
	// attempt (the handler not called, or its success lost).
	herr := fault.Err("outbox-before-handler")
	if herr == nil {
		herr = d.call(h, m)
		if herr == nil {
			herr = fault.Err("outbox-after-handler")
		}
	}
	switch {
	case herr == nil:
		err := e.pipe.Do(func(tx *bbolt.Tx) error { return outboxBucket(tx).Delete(layout.U64(m.Seq)) })
		if err == nil {
			err = fault.Err("outbox-after-mark") // as a mark whose answer was lost
		}
		if err != nil {
			e.log.Warn("idem: outbox: removing a delivered message failed; it will be delivered again", "topic", m.Topic, "seq", m.Seq, "err", err)
			r.retryAt = e.now().Add(e.backoff(1, rand.Float64()))
			return
		}
		e.outbox().delivered.Add(1)
		e.observe(Event{Kind: EventDelivery, Topic: m.Topic})
		r.removed = true
	case d.ctx.Err() != nil:
		// Stopping: the attempt does not count.
	default:
		next, removed, err := e.recordFailure(m.Seq, herr)
		if err == nil {
			err = fault.Err("outbox-after-mark") // as a mark whose answer was lost
		}
		e.observeFailure(m, removed && err == nil)
		if err != nil {
			e.log.Warn("idem: outbox: recording a failed attempt failed", "topic", m.Topic, "seq", m.Seq, "err", err)
			next = e.now().Add(e.backoff(m.Attempt, rand.Float64()))
		}
		r.retryAt, r.removed = next, removed
	}
}

// call runs the handler, turning a panic into an error.
func (d *dispatcher) call(h Handler, m Message) (err error) {
	defer func() {
		if v := recover(); v != nil {
			d.e.log.Warn("idem: outbox handler panicked", "topic", m.Topic, "seq", m.Seq)
			err = fmt.Errorf("handler panicked: %v\n\n%s", v, debug.Stack())
		}
	}()
	return h(d.ctx, m)
}

// recordFailure counts a failed attempt of message seq: it schedules the next
// attempt after a backoff, or moves the message to the dead letters after
// MaxAttempts. removed reports that it left the outbox.
func (e *Engine) recordFailure(seq uint64, herr error) (next time.Time, removed bool, err error) {
	o := e.outbox().opts
	now, jitter := e.now(), rand.Float64() // outside the fn: it may run twice
	msg := herr.Error()
	if len(msg) > maxLastErrLen {
		msg = msg[:maxLastErrLen]
	}
	err = e.pipe.Do(func(tx *bbolt.Tx) error {
		next, removed = time.Time{}, false
		ob, k := outboxBucket(tx), layout.U64(seq)
		v := ob.Get(k)
		if v == nil {
			removed = true
			return nil
		}
		m, err := decodeMessage(seq, v)
		if err != nil {
			removed = true
			return moveRaw(tx, k)
		}
		m.Failures++
		m.LastError = msg
		if o.MaxAttempts > 0 && m.Failures >= o.MaxAttempts {
			removed = true
			m.NextAttemptAt, m.Dead, m.DeadAt = time.Time{}, true, now
			m.DeadLetterRetention = o.DeadLetterRetention
			if err := deadBucket(tx).Put(k, encodeMessage(nil, m)); err != nil {
				return err
			}
			return ob.Delete(k)
		}
		next = now.Add(e.backoff(m.Failures, jitter))
		m.NextAttemptAt = next
		return ob.Put(k, encodeMessage(nil, m))
	})
	return next, removed, err
}

// backoff is the wait after the failed attempt number n (from 1): BaseBackoff
// doubled n-1 times, capped at MaxBackoff, jittered into [w/2, w) by jitter
// in [0, 1).
func (e *Engine) backoff(n int, jitter float64) time.Duration {
	o := e.outbox().opts
	w := o.MaxBackoff
	if n-1 < 62 && o.BaseBackoff <= o.MaxBackoff>>(n-1) {
		w = o.BaseBackoff << (n - 1)
	}
	return w/2 + time.Duration(jitter*float64(w/2))
}

// quarantine moves outbox entries that fail to decode to the dead letters as
// they are, so they hold nothing back; `idem outbox ls` shows them and
// DropDead deletes them.
func (e *Engine) quarantine(seqs []uint64) {
	err := e.pipe.Do(func(tx *bbolt.Tx) error {
		for _, seq := range seqs {
			k := layout.U64(seq)
			v := outboxBucket(tx).Get(k)
			if v == nil {
				continue
			}
			if _, err := decodeMessage(seq, v); err == nil {
				continue
			}
			if err := moveRaw(tx, k); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		e.log.Warn("idem: outbox: moving corrupt messages to the dead letters failed", "err", err)
		return
	}
	e.log.Warn("idem: outbox: corrupt messages moved to the dead letters", "messages", len(seqs))
}

func moveRaw(tx *bbolt.Tx, k []byte) error {
	v := bytes.Clone(outboxBucket(tx).Get(k))
	if err := deadBucket(tx).Put(k, v); err != nil {
		return err
	}
	return outboxBucket(tx).Delete(k)
}

type timer struct {
	at time.Time
	ok string
}

type timerHeap []timer

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h timerHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *timerHeap) Push(x any)        { *h = append(*h, x.(timer)) }
func (h *timerHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	*h = old[:len(old)-1]
	return t
}

// ---- message encoding ----

// Message encoding, version 1 (little endian), stored under the message's
// sequence number (u64 big endian) in idem/outbox or idem/dead:
//
//	version   u8 = 1
//	flags     u8   (1: ordering key differs from key, 2: payload non-nil,
//	                4: last error stored, 8: dead-letter retention stored)
//	index     uvarint
//	attempts  uvarint  failed attempts so far
//	enqueued  i64  unix nanoseconds
//	next      i64  unix nanoseconds, 0 for at once
//	dead      i64  unix nanoseconds, 0 while pending
//	key       uvarint length, bytes
//	ordering  uvarint length, bytes   (if flag 1)
//	topic     uvarint length, bytes
//	payload   uvarint length, bytes   (if flag 2)
//	lasterr   uvarint length, bytes   (if flag 4)
//	deadret   uvarint nanoseconds     (if flag 8: the dead-letter retention
//	                                   in force when it died; format version 2)
//	crc       u32  CRC-32C of every byte before it
const (
	messageVersion = 1
	messageFixed   = 2 + 8*3

	msgFlagOrdering = 1 << 0
	msgFlagPayload  = 1 << 1
	msgFlagLastErr  = 1 << 2
	msgFlagDeadRet  = 1 << 3
)

// encodeMessage appends m's encoding to dst. Seq and DownstreamKey are not
// part of it: the first is the bbolt key, the second derived.
func encodeMessage(dst []byte, m *Message) []byte {
	start := len(dst)
	var flags byte
	if m.OrderingKey != m.Key {
		flags |= msgFlagOrdering
	}
	if m.Payload != nil {
		flags |= msgFlagPayload
	}
	if m.LastError != "" {
		flags |= msgFlagLastErr
	}
	if m.Dead && m.DeadLetterRetention > 0 {
		flags |= msgFlagDeadRet
	}
	dst = append(dst, messageVersion, flags)
	dst = binary.AppendUvarint(dst, uint64(m.Index))
	dst = binary.AppendUvarint(dst, uint64(m.Failures))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(unixNano(m.EnqueuedAt)))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(unixNano(m.NextAttemptAt)))
	dead := int64(0)
	if m.Dead {
		dead = unixNano(m.DeadAt)
		if dead == 0 {
			dead = 1
		}
	}
	dst = binary.LittleEndian.AppendUint64(dst, uint64(dead))
	dst = appendBytes(dst, []byte(m.Key))
	if flags&msgFlagOrdering != 0 {
		dst = appendBytes(dst, []byte(m.OrderingKey))
	}
	dst = appendBytes(dst, []byte(m.Topic))
	if flags&msgFlagPayload != 0 {
		dst = appendBytes(dst, m.Payload)
	}
	if flags&msgFlagLastErr != 0 {
		dst = appendBytes(dst, []byte(m.LastError))
	}
	if flags&msgFlagDeadRet != 0 {
		dst = binary.AppendUvarint(dst, uint64(m.DeadLetterRetention))
	}
	return binary.LittleEndian.AppendUint32(dst, crc32.Checksum(dst[start:], crcTable))
}

// decodeMessage decodes b, which may point into bbolt's mmap: everything kept
// is copied. It never panics; every failure wraps ErrCorrupt.
func decodeMessage(seq uint64, b []byte) (*Message, error) {
	corrupt := func(why string) error {
		return &OpError{Op: "decode message", Err: fmt.Errorf("%w: message %d: %s", ErrCorrupt, seq, why)}
	}
	body, why := unframe(b, "message", messageVersion, messageFixed+2+1+1)
	if why != "" {
		return nil, corrupt(why)
	}
	flags := body[1]
	if flags&^(msgFlagOrdering|msgFlagPayload|msgFlagLastErr|msgFlagDeadRet) != 0 {
		return nil, corrupt(fmt.Sprintf("unknown flags %#x", flags))
	}
	rest := body[2:]
	var vals [2]uint64
	for i := range vals {
		v, n := binary.Uvarint(rest)
		if n <= 0 || v > 1<<31 {
			return nil, corrupt("bad index or attempt count")
		}
		vals[i], rest = v, rest[n:]
	}
	if len(rest) < 24 {
		return nil, corrupt("truncated times")
	}
	m := &Message{Seq: seq, Index: int(vals[0]), Failures: int(vals[1])}
	m.EnqueuedAt = fromUnixNano(int64(binary.LittleEndian.Uint64(rest)))
	m.NextAttemptAt = fromUnixNano(int64(binary.LittleEndian.Uint64(rest[8:])))
	if dead := int64(binary.LittleEndian.Uint64(rest[16:])); dead != 0 {
		m.Dead, m.DeadAt = true, fromUnixNano(dead)
	}
	rest = rest[24:]
	field := func(name string) (string, error) {
		var f []byte
		var err error
		if f, rest, err = readBytes(rest); err != nil {
			return "", corrupt(name + ": " + err.Error())
		}
		return string(f), nil
	}
	var err error
	if m.Key, err = field("key"); err != nil {
		return nil, err
	}
	m.OrderingKey = m.Key
	if flags&msgFlagOrdering != 0 {
		if m.OrderingKey, err = field("ordering key"); err != nil {
			return nil, err
		}
	}
	if m.Topic, err = field("topic"); err != nil {
		return nil, err
	}
	if flags&msgFlagPayload != 0 {
		if m.Payload, rest, err = readBytes(rest); err != nil {
			return nil, corrupt("payload: " + err.Error())
		}
	}
	if flags&msgFlagLastErr != 0 {
		if m.LastError, err = field("last error"); err != nil {
			return nil, err
		}
	}
	if flags&msgFlagDeadRet != 0 {
		v, n := binary.Uvarint(rest)
		if n <= 0 || v == 0 || v > math.MaxInt64 || !m.Dead {
			return nil, corrupt("bad dead-letter retention")
		}
		m.DeadLetterRetention, rest = time.Duration(v), rest[n:]
	}
	if len(rest) != 0 {
		return nil, corrupt(fmt.Sprintf("%d trailing bytes", len(rest)))
	}
	if m.Key == "" || m.Topic == "" {
		return nil, corrupt("empty key or topic")
	}
	m.DownstreamKey = DownstreamKey(m.Key, m.Index)
	return m, nil
}
