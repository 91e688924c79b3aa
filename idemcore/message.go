package idemcore

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Message is an outbox message: as a Backend stores it, as a Handler
// receives it, and as Engine.Messages lists it.
type Message struct {
	// Seq names the message in its store (RetryDead, DropDead, the CLI): the
	// backend assigns it at Enqueue; it is unique and increases in enqueue
	// order (bbolt: the bucket's sequence; Postgres: a bigserial).
	Seq uint64
	// Topic selects the handler.
	Topic string
	// Key is the idempotency key of the DoTx call that enqueued the message.
	Key string
	// Index is the message's position among the messages of that call,
	// from 0.
	Index int
	// DownstreamKey is DownstreamKey(Key, Index): the key to pass on to the
	// downstream system. Retries of the message reuse it; other messages
	// never share it. Backends need not store it; the engine fills it in.
	DownstreamKey string
	// OrderingKey groups the messages delivered in enqueue order, one at a
	// time: by default Key.
	OrderingKey string
	// Payload is the bytes given to Enqueue (nil and empty differ). The
	// handler owns its copy.
	Payload []byte
	// Attempt is, in a handler, the delivery attempt in progress
	// (Failures+1); zero as stored.
	Attempt int
	// Failures counts the failed delivery attempts recorded so far (a
	// handler's error or panic); an attempt cut short by a crash or by the
	// end of Dispatch is not counted. RetryDead resets it to 0.
	Failures int
	// EnqueuedAt is when the call enqueued it. Its times are readings of
	// the clock that judges the store's times (Record.StartedAt's).
	EnqueuedAt time.Time
	// NextAttemptAt is when a message that failed may be tried again; zero
	// for at once.
	NextAttemptAt time.Time
	// LastError is the text of the last failed attempt's error (its first
	// 4 KiB), empty if none.
	LastError string
	// Dead is true for a dead letter, DeadAt when it died.
	Dead   bool
	DeadAt time.Time
	// Trace is the trace context of the DoTx call that enqueued the message,
	// as its Tracer gave it (Tracer.MessageTrace: for idemotel, a W3C
	// traceparent and tracestate), at most MaxMessageTrace bytes; nil if
	// none, or if its store did not record it (a bbolt message of encoding
	// version 1, a Postgres schema before version 6). The engine hands it to
	// the Tracer with each delivery attempt (DeliveryStart.Trace).
	Trace []byte
	// DeadLetterRetention is the OutboxOptions.DeadLetterRetention in force
	// when the message died, recorded with it: a dead letter lives at least
	// this long after DeadAt (or a later open's longer retention), whatever
	// a later open passes. Zero for a message that is not dead, and for a
	// dead letter whose store did not record it (a bbolt file of format
	// version 1), which lives at least DefaultOutboxDeadLetterRetention.
	DeadLetterRetention time.Duration
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
// the message is left to the dispatcher that holds it. A panic counts as a
// failed attempt. A handler must not call Close.
type Handler func(ctx context.Context, m Message) error

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

// DeadLetterExpiry is when dead letter m leaves its retention: DeadAt plus
// the longer of m.DeadLetterRetention (DefaultOutboxDeadLetterRetention if
// its store did not record one) and retention (the reader's
// OutboxOptions.DeadLetterRetention; 0 for the message's own). An expired
// dead letter is absent to Messages and RetryDead.
func DeadLetterExpiry(m *Message, retention time.Duration) time.Time {
	return m.DeadAt.Add(max(cmp.Or(m.DeadLetterRetention, DefaultOutboxDeadLetterRetention), retention))
}

// maxLastErrLen is the most bytes of a handler's error kept with a message
// (Message.LastError), cut at a rune boundary (truncateError).
const maxLastErrLen = 4096

// ErrInvalidMessage is returned by Enqueue (idem.Tx.Enqueue and
// EnqueueOrdered, idempg.Enqueue) for a topic that is empty, longer than
// MaxTopicLen bytes, not valid UTF-8 or holding a NUL byte, or for an
// ordering key longer than MaxKeyLen bytes, not valid UTF-8 or holding a NUL
// byte (Postgres text cannot hold NUL; every backend refuses it alike).
// Nothing is enqueued.
var ErrInvalidMessage = errors.New("invalid outbox message")

// MaxTopicLen is the longest outbox topic, in bytes (as for keys).
const MaxTopicLen = 255

// ValidateMessage checks an Enqueue's topic and ordering key, for every
// backend: the topic is 1 to MaxTopicLen bytes of UTF-8 without NUL, the
// ordering key (empty: the call's key) at most MaxKeyLen bytes of UTF-8
// without NUL. NUL is refused because Postgres text cannot hold it (the
// rule is the same on bbolt, so a program moves between backends unchanged).
// The error wraps ErrInvalidMessage.
func ValidateMessage(topic, orderingKey string) error {
	switch {
	case topic == "" || len(topic) > MaxTopicLen || !utf8.ValidString(topic) || strings.IndexByte(topic, 0) >= 0:
		return fmt.Errorf("%w: topic must be 1 to %d bytes of UTF-8 without NUL", ErrInvalidMessage, MaxTopicLen)
	case len(orderingKey) > MaxKeyLen || !utf8.ValidString(orderingKey) || strings.IndexByte(orderingKey, 0) >= 0:
		return fmt.Errorf("%w: ordering key must be at most %d bytes of UTF-8 without NUL", ErrInvalidMessage, MaxKeyLen)
	}
	return nil
}

// truncateError cuts an error text to at most n bytes at a rune boundary
// (Message.LastError's "first 4 KiB"), so that the cut never leaves half a
// character. Invalid UTF-8 in s is kept as it is (backends store bytes).
func truncateError(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n
	// Step back over continuation bytes to the start of the rune at n, at
	// most utf8.UTFMax-1 of them.
	for j := 0; j < utf8.UTFMax-1 && i > 0 && !utf8.RuneStart(s[i]); j++ {
		i--
	}
	if !utf8.RuneStart(s[i]) {
		// Not a valid sequence around n: cut bytes, nothing to keep whole.
		i = n
	} else if r, size := utf8.DecodeRuneInString(s[i:]); r == utf8.RuneError && size <= 1 {
		i = n
	}
	return s[:i]
}
