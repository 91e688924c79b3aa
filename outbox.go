package idem

import (
	"context"

	"go.etcd.io/bbolt"

	"github.com/idemkit/idem/idemcore"
)

// Defaults for the zero values of OutboxOptions (idemcore's).
const (
	DefaultOutboxWorkers             = idemcore.DefaultOutboxWorkers             // handlers running at once
	DefaultOutboxBaseBackoff         = idemcore.DefaultOutboxBaseBackoff         // the wait after a first failed attempt
	DefaultOutboxMaxBackoff          = idemcore.DefaultOutboxMaxBackoff          // the cap of the wait between attempts
	DefaultOutboxMaxAttempts         = idemcore.DefaultOutboxMaxAttempts         // failed attempts before a dead letter
	DefaultOutboxDeadLetterRetention = idemcore.DefaultOutboxDeadLetterRetention // how long a dead letter is kept
	DefaultOutboxPollInterval        = idemcore.DefaultOutboxPollInterval        // the longest the dispatcher sleeps
)

// OutboxOptions configure the outbox dispatcher (idemcore.OutboxOptions
// documents each field: Dispatch, Handlers, Workers, backoff, MaxAttempts,
// DeadLetterRetention, PollInterval).
type OutboxOptions = idemcore.OutboxOptions

// OutboxStats counts outbox messages, as Engine.ScanFile returns them
// (FileStats.Outbox; idemcore.OutboxStats documents the counts).
type OutboxStats = idemcore.OutboxStats

// Handler delivers one outbox message to the system it is for, at least
// once: pass m.DownstreamKey on (idemcore.Handler gives the contract).
type Handler = idemcore.Handler

// Message is an outbox message, as given to a Handler and as listed by
// Engine.Messages (idemcore.Message documents its fields: Seq, Topic, Key,
// Index, DownstreamKey, OrderingKey, Payload, Attempt, Failures, EnqueuedAt,
// NextAttemptAt, LastError, Dead, DeadAt, DeadLetterRetention).
type Message = idemcore.Message

// DownstreamKey is the key a message passes on to the downstream system
// (Message.DownstreamKey): key + "/" + index, or a SHA-256 form past
// MaxKeyLen bytes (idemcore.DownstreamKey), the same on every attempt.
func DownstreamKey(key string, index int) string { return idemcore.DownstreamKey(key, index) }

// Messages calls fn for every message in the file, in one read transaction:
// the pending ones in enqueue order, then the dead letters inside their
// retention, by Seq. A message that fails to decode is passed with only Seq
// and Dead set and an error wrapping ErrCorrupt. An error from fn stops the
// walk and is returned. fn runs inside the read transaction: any engine call
// from it (on its goroutine), RetryDead and DropDead included, returns
// ErrReentrant, since a write would wait for the transaction to end (collect
// the Seqs, then act); fn must not call Close. Under ReadOnly, Messages
// works; RetryDead and DropDead fail.
func (e *Engine) Messages(fn func(m *Message, err error) error) error { return e.c.Messages(fn) }

// RetryDead puts dead letter seq back in the outbox at its old place, its
// failure count from 0 (idemcore.Engine.RetryDead); ErrMessageNotFound if
// seq is not a dead letter (or expired), ErrCorrupt if it does not decode.
func (e *Engine) RetryDead(seq uint64) error { return e.c.RetryDead(seq) }

// DropDead deletes dead letter seq, also one that fails to decode. It fails
// with ErrMessageNotFound if seq is not a dead letter.
func (e *Engine) DropDead(seq uint64) error { return e.c.DropDead(seq) }

// Handle registers h for topic's messages, replacing the handler given in
// OutboxOptions.Handlers or by an earlier Handle; a nil h removes it.
// Messages of a topic without a handler wait in the outbox, holding back the
// later messages of their ordering key.
func (e *Engine) Handle(topic string, h Handler) { e.c.Handle(topic, h) }

// Dispatch runs the dispatcher until ctx ends (ctx.Err()) or the engine
// closes (ErrClosed), for an engine opened without OutboxOptions.Dispatch;
// one dispatcher per file, so a second one, or one while Dispatch is set,
// fails with an error wrapping idemcore.ErrDispatcherRunning. On return every
// handler it started has returned.
func (e *Engine) Dispatch(ctx context.Context) error { return e.c.Dispatch(ctx) }

// outboxStats counts the messages in tx for Engine.ScanFile.
func (e *Engine) outboxStats(tx *bbolt.Tx, s *OutboxStats) error {
	s.Delivered = e.c.Stats().Delivered
	now := e.c.Now()
	retention := e.c.Options().Outbox.DeadLetterRetention
	err := outboxBucket(tx).ForEach(func(k, v []byte) error {
		seq, _ := parseU64Key(k)
		m, err := decodeMessage(seq, v)
		if err != nil {
			s.Corrupt++
			return nil
		}
		s.Pending++
		if m.Failures > 0 {
			s.Retrying++
		}
		if e.c.Handler(m.Topic) == nil {
			s.Waiting++
		}
		return nil
	})
	if err != nil {
		return err
	}
	return deadBucket(tx).ForEach(func(k, v []byte) error {
		seq, _ := parseU64Key(k)
		m, err := decodeMessage(seq, v)
		switch {
		case err != nil:
			s.Corrupt++
		case now.Before(idemcore.DeadLetterExpiry(m, retention)):
			s.Dead++
		}
		return nil
	})
}

func outboxBucket(tx *bbolt.Tx) *bbolt.Bucket { return rootBucket(tx).Bucket(outboxName) }
func deadBucket(tx *bbolt.Tx) *bbolt.Bucket   { return rootBucket(tx).Bucket(deadName) }

// Messages walks the pending messages, then the dead letters, by Seq.
func (b *boltBackend) Messages(_ context.Context, fn func(m *idemcore.Message, err error) error) error {
	if err := b.settle(true); err != nil {
		return err
	}
	defer b.reads.unmark(b.reads.mark()) // fn runs inside the read transaction
	var inUser bool
	return viewUser(b.db, &inUser, func(tx *bbolt.Tx) error {
		for _, dead := range []bool{false, true} {
			bk := outboxBucket(tx)
			if dead {
				bk = deadBucket(tx)
			}
			c := bk.Cursor()
			for k, v := c.First(); k != nil; k, v = c.Next() {
				seq, _ := parseU64Key(k)
				m, err := decodeMessage(seq, v)
				if err != nil {
					m = &idemcore.Message{Seq: seq, Dead: dead}
				}
				inUser = true
				err = fn(m, err)
				inUser = false
				if err != nil {
					return err
				}
			}
		}
		return nil
	})
}
