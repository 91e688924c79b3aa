package idem

import "github.com/idemkit/idem/idemcore"

// Observer receives the engine's events, for metrics: Options.Observer
// (idemcore.Observer says where it is called and what it must not do).
// github.com/idemkit/idem/idemprom implements it for Prometheus.
type Observer = idemcore.Observer

// EventKind says what an Event reports; String gives its name in snake case
// ("execution", "in_progress", "dead_letter"), or "EventKind(N)" for an
// unknown kind.
type EventKind = idemcore.EventKind

// The event kinds (idemcore documents each one's Op, Topic, N and Duration).
const (
	EventExecution      = idemcore.EventExecution      // fn starts running
	EventReplay         = idemcore.EventReplay         // a call is answered from a done record
	EventConflict       = idemcore.EventConflict       // a call is refused with ErrFingerprintMismatch
	EventWait           = idemcore.EventWait           // a duplicate waits for the running call
	EventInProgress     = idemcore.EventInProgress     // a duplicate is refused with ErrInProgress
	EventCommit         = idemcore.EventCommit         // a write transaction committed (N writes)
	EventPrune          = idemcore.EventPrune          // a prune run ended (N records removed)
	EventDelivery       = idemcore.EventDelivery       // an outbox message was delivered
	EventDeliveryFailed = idemcore.EventDeliveryFailed // a delivery attempt failed
	EventDeadLetter     = idemcore.EventDeadLetter     // a message became a dead letter
)

// Event is one thing the engine did: its Kind; Op ("do" or "dotx") for the
// events of a call; Topic, the outbox message's topic for the outbox events;
// N, a count, and Duration, a latency, as the kind says. Fields a kind does
// not use are zero.
type Event = idemcore.Event
