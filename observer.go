package idem

import (
	"time"

	core "github.com/idemkit/idem/idemcore"
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
// (internal/core), shared by every backend.
type Observer = core.Observer

// EventKind says what an Event reports; String gives its name in snake case
// ("execution", "in_progress", "dead_letter"), or "EventKind(N)" for an
// unknown kind.
type EventKind = core.EventKind

// The event kinds (internal/core documents each).
const (
	// EventExecution: fn starts running (Op "do" or "dotx"). N is the
	// attempt: 1 for a new key, more when it re-executes an interrupted
	// execution (RecoverReexecute).
	EventExecution = core.EventExecution
	// EventReplay: a call is answered from a done record, fn does not run
	// (Op). Duplicates answered by the call they waited for are
	// EventWait, not replays.
	EventReplay = core.EventReplay
	// EventConflict: a call is refused with ErrFingerprintMismatch (Op).
	EventConflict = core.EventConflict
	// EventWait: a duplicate starts waiting for the running call with its
	// key, under InFlightWait (Op).
	EventWait = core.EventWait
	// EventInProgress: a duplicate is refused with ErrInProgress, under
	// InFlightFail (Op): the HTTP adapter's 409.
	EventInProgress = core.EventInProgress
	// EventCommit: a write transaction committed. N is the writes it
	// carried (the group-commit batch size), Duration the time bbolt's
	// Commit took, fsync included (real time, not Options.Now).
	EventCommit = core.EventCommit
	// EventPrune: a prune run ended (the background pruner or Prune). N is
	// the records it removed, Duration how long it ran (real time).
	EventPrune = core.EventPrune
	// EventDelivery: an outbox message was delivered and removed (Topic).
	EventDelivery = core.EventDelivery
	// EventDeliveryFailed: a delivery attempt failed (Topic); N is the
	// message's failed attempts so far.
	EventDeliveryFailed = core.EventDeliveryFailed
	// EventDeadLetter: a message became a dead letter (Topic), after
	// OutboxOptions.MaxAttempts failed attempts or because it fails to
	// decode.
	EventDeadLetter = core.EventDeadLetter
)

// Event is one thing the engine did: its Kind; Op ("do" or "dotx") for the
// events of a call; Topic, the outbox message's topic for the outbox events;
// N, a count, and Duration, a latency, as the kind says. Fields a kind does
// not use are zero.
type Event = core.Event

// watchCommits reports every commit of the pipeline to the observer. It runs
// in Open, before the first commit.
func (e *Engine) watchCommits() {
	if o := e.opts.Observer; o != nil {
		e.pipe.Observe = func(n int, d time.Duration) { o.Observe(Event{Kind: EventCommit, N: n, Duration: d}) }
	}
}
