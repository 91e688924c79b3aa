package idem

import (
	"bytes"
	"time"

	"go.etcd.io/bbolt"

	"github.com/idemkit/idem/internal/core"
	"github.com/idemkit/idem/internal/layout"
)

// Defaults for the zero values of OutboxOptions, each named DefaultOutbox and
// its field.
const (
	// DefaultOutboxWorkers bounds the handlers running at once.
	DefaultOutboxWorkers = core.DefaultOutboxWorkers
	// DefaultOutboxBaseBackoff is the wait after a message's first failed attempt.
	DefaultOutboxBaseBackoff = core.DefaultOutboxBaseBackoff
	// DefaultOutboxMaxBackoff caps the wait between two attempts.
	DefaultOutboxMaxBackoff = core.DefaultOutboxMaxBackoff
	// DefaultOutboxMaxAttempts is the number of failed attempts after which a
	// message becomes a dead letter. With the default backoff, the last
	// attempt comes between about 53 minutes and 1 hour 47 minutes after the
	// first.
	DefaultOutboxMaxAttempts = core.DefaultOutboxMaxAttempts
	// DefaultOutboxDeadLetterRetention is how long a dead letter is kept.
	DefaultOutboxDeadLetterRetention = core.DefaultOutboxDeadLetterRetention
	// DefaultOutboxPollInterval is the longest the dispatcher sleeps while a
	// message waits for its backoff.
	DefaultOutboxPollInterval = core.DefaultOutboxPollInterval
)

const maxTopicLen = core.MaxTopicLen // bytes, as for keys

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
// On a shared backend (idempg) it also ends, with cause ErrLeaseLost, the
// moment the message's claim has passed unrenewed (another dispatcher may
// deliver it meanwhile); an error returned then does not count either, and
// the message is left to the dispatcher that holds it.
// A panic counts as a failed attempt. A handler must not call Close. The
// type is the dispatcher's (internal/core), shared by every backend.
type Handler = core.Handler

// Enqueue stores a message for topic's handler in the outbox, in fn's
// transaction: it commits with the call's record and fn's writes, or not at
// all. Its ordering key is the call's idempotency key. payload is stored as
// given (copied). The message is delivered after the commit, at least once,
// after the messages enqueued before it with the same ordering key. topic is
// 1 to 255 bytes of UTF-8 without NUL, else ErrInvalidMessage.
func (t *Tx) Enqueue(topic string, payload []byte) error {
	return t.EnqueueOrdered(topic, "", payload)
}

// EnqueueOrdered is Enqueue with another ordering key, for example an order
// id, so that messages of different calls about one thing are delivered in
// the order they were enqueued (a refund never overtakes its charge). An empty
// orderingKey means the call's idempotency key. orderingKey is at most
// MaxKeyLen bytes of UTF-8 without NUL, else ErrInvalidMessage.
func (t *Tx) EnqueueOrdered(topic, orderingKey string, payload []byte) error {
	if t.tx == nil {
		return &OpError{Op: "enqueue", Key: t.key, Err: ErrTxClosed}
	}
	if err := core.ValidateMessage(topic, orderingKey); err != nil {
		return &OpError{Op: "enqueue", Key: t.key, Err: err}
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
	return e.core.Outbox().Messages(fn)
}

// RetryDead puts dead letter seq back in the outbox at its old place: its
// attempt count starts again from 0, and as the oldest message of its
// ordering key it is delivered before that key's later pending messages. It
// fails with ErrMessageNotFound if seq is not a dead letter (or expired), with
// ErrCorrupt if it does not decode. Like every engine call, it returns
// ErrReentrant from inside a DoTx fn (which holds the writer).
func (e *Engine) RetryDead(seq uint64) error { return e.core.Outbox().RetryDead(seq) }

// DropDead deletes dead letter seq, also one that fails to decode. It fails
// with ErrMessageNotFound if seq is not a dead letter.
func (e *Engine) DropDead(seq uint64) error { return e.core.Outbox().DropDead(seq) }

// outboxStats counts the messages in tx for Engine.ScanFile.
func (e *Engine) outboxStats(tx *bbolt.Tx, s *OutboxStats) error {
	ob := e.core.Outbox()
	s.Delivered = ob.Delivered()
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
		if ob.Handler(m.Topic) == nil {
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
		case !ob.DeadExpired(m, now):
			s.Dead++
		}
		return nil
	})
}

func outboxBucket(tx *bbolt.Tx) *bbolt.Bucket { return rootBucket(tx).Bucket(layout.Outbox) }
func deadBucket(tx *bbolt.Tx) *bbolt.Bucket   { return rootBucket(tx).Bucket(layout.Dead) }

// moveRaw moves pending message k, as it is, to the dead letters.
func moveRaw(tx *bbolt.Tx, k []byte) error {
	v := bytes.Clone(outboxBucket(tx).Get(k))
	if err := deadBucket(tx).Put(k, v); err != nil {
		return err
	}
	return outboxBucket(tx).Delete(k)
}
