package idempg

import (
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idemcore"
)

// txState is what Enqueue needs of the DoTx call whose transaction it is
// given: the key and the index of its next message.
type txState struct {
	b    *backend
	key  string
	next int
	// trace is the call's trace context, stored with each message
	// (idemcore.Claim.Trace).
	trace []byte
	note  *outboxNote // the transaction's
}

// outboxNote records whether a transaction of DoTx calls already notifies
// the dispatchers of other processes of its messages: one notification per
// transaction wakes them (they claim whatever is due), so the calls after
// the first that enqueued notify no more (runOne).
type outboxNote struct{ sent bool }

// txs maps each DoTx transaction running fn to its call.
var txs sync.Map // pgx.Tx → *txState

// Enqueue stores an outbox message for topic in tx, the transaction of a
// DoTx fn: it commits with the call's done record and fn's writes, or not
// at all. Its ordering key is the call's idempotency key; payload is stored
// as given (nil and empty differ). topic is 1 to 255 bytes of UTF-8 without
// NUL, else the error wraps idemcore.ErrInvalidMessage. A tx that is not a running DoTx fn's
// gives an error wrapping idemcore.ErrTxClosed.
func Enqueue(tx pgx.Tx, topic string, payload []byte) error {
	return EnqueueOrdered(tx, topic, "", payload)
}

// EnqueueOrdered is Enqueue with another ordering key (for example an order
// id): the messages of one ordering key are delivered one at a time, in
// enqueue order, by however many processes drain the outbox. An empty
// orderingKey means the call's idempotency key; it is at most 255 bytes of
// UTF-8 without NUL, else idemcore.ErrInvalidMessage.
func EnqueueOrdered(tx pgx.Tx, topic, orderingKey string, payload []byte) error {
	v, ok := txs.Load(tx)
	if !ok {
		return fmt.Errorf("%w: the transaction is not a running DoTx fn's", idemcore.ErrTxClosed)
	}
	st := v.(*txState)
	if err := idemcore.ValidateMessage(topic, orderingKey); err != nil {
		return err
	}
	if orderingKey == "" {
		orderingKey = st.key
	}
	m := &idemcore.Message{Topic: topic, Key: st.key, Index: st.next, OrderingKey: orderingKey, Payload: payload, Trace: st.trace}
	if err := st.b.Enqueue(tx, m); err != nil {
		return err
	}
	st.next++
	return nil
}
