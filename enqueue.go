package idem

// Enqueue: outbox messages written in a DoTx fn's transaction.

import (
	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/internal/fault"
)

// Enqueue puts m in the outbox bucket inside the DoTx transaction.
func (b *boltBackend) Enqueue(tx *Tx, m *idemcore.Message) error {
	if tx.tx == nil && tx.v == nil {
		return ErrTxClosed
	}
	if err := fault.Err("outbox-enqueue"); err != nil {
		return err // as a failed write: fn gets the error
	}
	if v := tx.v; v != nil { // through the journal
		a, _ := v.resolve(outboxPath)
		m.Seq = v.sequence(a, outboxPath) + 1
		if err := v.setSequence(outboxPath, m.Seq); err != nil {
			return err
		}
		return v.put(outboxPath, u64Key(m.Seq), encodeMessage(nil, m))
	}
	ob := outboxBucket(tx.tx)
	seq, err := ob.NextSequence()
	if err != nil {
		return err
	}
	m.Seq = seq
	return ob.Put(u64Key(seq), encodeMessage(nil, m))
}

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
	if t.tx == nil && t.v == nil {
		return &OpError{Op: "enqueue", Key: t.key, Err: ErrTxClosed}
	}
	if err := idemcore.ValidateMessage(topic, orderingKey); err != nil {
		return &OpError{Op: "enqueue", Key: t.key, Err: err}
	}
	if orderingKey == "" {
		orderingKey = t.key
	}
	m := &Message{Topic: topic, Key: t.key, Index: t.msgs, OrderingKey: orderingKey,
		Payload: payload, EnqueuedAt: t.b.now(), Trace: t.trace}
	if err := t.b.Enqueue(t, m); err != nil {
		return &OpError{Op: "enqueue", Key: t.key, Err: err}
	}
	t.msgs++
	return nil
}
