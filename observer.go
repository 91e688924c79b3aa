package idem

import (
	"time"

	"github.com/idemkit/idem/idemcore"
)

// Observer receives the engine's events, for metrics: Options.Observer.
// github.com/idemkit/idem/idemprom implements it for Prometheus.
//
// Observe is called synchronously, on the goroutine of the call, the
// committer, the pruner or a dispatcher worker, so it must be fast, must not
// block and must be safe for concurrent use; it must not call the engine
// (an EventCommit arrives while the committer holds the file's writer). An
// Event never carries an idempotency key, a response, a payload or an
// error's text: only its Kind, the operation ("do", "dotx"), an outbox
// topic, a count and a duration. The types are the state machine's
// (idemcore), shared by every backend.
type Observer = idemcore.Observer

// EventKind says what an Event reports; String gives its name in snake case
// ("execution", "in_progress", "dead_letter"), or "EventKind(N)" for an
// unknown kind.
type EventKind = idemcore.EventKind

// The event kinds (idemcore documents each).
const (
	// EventExecution: fn starts running (Op "do" or "dotx"). N is the
	// attempt: 1 for a new key, more when it re-executes an interrupted
	// execution (RecoverReexecute).
	EventExecution = idemcore.EventExecution
	// EventReplay: a call is answered from a done record, fn does not run
	// (Op). Duplicates answered by the call they waited for are
	// EventWait, not replays.
	EventReplay = idemcore.EventReplay
	// EventConflict: a call is refused with ErrFingerprintMismatch (Op).
	EventConflict = idemcore.EventConflict
	// EventWait: a duplicate starts waiting for the running call with its
	// key, under InFlightWait (Op).
	EventWait = idemcore.EventWait
	// EventInProgress: a duplicate is refused with ErrInProgress, under
	// InFlightFail (Op): the HTTP adapter's 409.
	EventInProgress = idemcore.EventInProgress
	// EventCommit: a write transaction committed. N is the writes it
	// carried (the group-commit batch size), Duration the time bbolt's
	// Commit took, fsync included (real time, not Options.Now).
	EventCommit = idemcore.EventCommit
	// EventPrune: a prune run ended (the background pruner or Prune). N is
	// the records it removed, Duration how long it ran (real time).
	EventPrune = idemcore.EventPrune
	// EventDelivery: an outbox message was delivered and removed (Topic).
	EventDelivery = idemcore.EventDelivery
	// EventDeliveryFailed: a delivery attempt failed (Topic); N is the
	// message's failed attempts so far.
	EventDeliveryFailed = idemcore.EventDeliveryFailed
	// EventDeadLetter: a message became a dead letter (Topic), after
	// OutboxOptions.MaxAttempts failed attempts or because it fails to
	// decode.
	EventDeadLetter = idemcore.EventDeadLetter
)

// Event is one thing the engine did: its Kind; Op ("do" or "dotx") for the
// events of a call; Topic, the outbox message's topic for the outbox events;
// N, a count, and Duration, a latency, as the kind says. Fields a kind does
// not use are zero.
type Event = idemcore.Event

// watchCommits reports every commit of the pipeline to the observer. It runs
// in Open, before the first commit.
func (e *Engine) watchCommits() {
	if o := e.opts.Observer; o != nil {
		e.pipe.Observe = func(n int, d time.Duration) { o.Observe(Event{Kind: EventCommit, N: n, Duration: d}) }
	}
}
