package idemcore

import "time"

// Observer receives the engine's events, for metrics: Options.Observer.
// github.com/idemkit/idem/idemprom implements it for Prometheus.
//
// Observe is called synchronously, on the goroutine of the call, the
// committer, the pruner or a dispatcher worker, so it must be fast, must not
// block and must be safe for concurrent use; it must not call the engine
// (an EventCommit arrives while the committer holds the file's writer). An
// Event never carries an idempotency key, a response, a payload or an
// error's text: only its Kind, the operation ("do", "dotx"), an outbox
// topic, a count and a duration.
type Observer interface {
	// Observe receives one event.
	Observe(Event)
}

// EventKind says what an Event reports.
type EventKind uint8

const (
	// EventExecution: fn starts running (Op "do" or "dotx"). N is the
	// attempt: 1 for a new key, more when it re-executes an interrupted
	// execution (RecoverReexecute).
	EventExecution EventKind = iota + 1
	// EventReplay: a call is answered from a done record, fn does not run
	// (Op). Duplicates answered by the call they waited for are
	// EventWait, not replays.
	EventReplay
	// EventConflict: a call is refused with ErrFingerprintMismatch (Op).
	EventConflict
	// EventWait: a duplicate starts waiting for the running call with its
	// key, under InFlightWait (Op).
	EventWait
	// EventInProgress: a duplicate is refused with ErrInProgress, under
	// InFlightFail (Op): the HTTP adapter's 409.
	EventInProgress
	// EventCommit: a write transaction committed. N is the writes it
	// carried (the group-commit batch size), Duration the time bbolt's
	// Commit took, fsync included (real time, not Options.Now).
	EventCommit
	// EventPrune: a prune run ended (the background pruner or Prune). N is
	// the records it removed, Duration how long it ran (real time).
	EventPrune
	// EventDelivery: an outbox message was delivered and removed (Topic).
	EventDelivery
	// EventDeliveryFailed: a delivery attempt failed (Topic); N is the
	// message's failed attempts so far.
	EventDeliveryFailed
	// EventDeadLetter: a message became a dead letter (Topic), after
	// OutboxOptions.MaxAttempts failed attempts or because it fails to
	// decode.
	EventDeadLetter
)

var eventNames = [...]string{
	EventExecution: "execution", EventReplay: "replay", EventConflict: "conflict",
	EventWait: "wait", EventInProgress: "in_progress", EventCommit: "commit",
	EventPrune: "prune", EventDelivery: "delivery", EventDeliveryFailed: "delivery_failed",
	EventDeadLetter: "dead_letter",
}

// String is the kind's name in snake case ("execution", "in_progress",
// "dead_letter"), or "EventKind(N)" for an unknown kind.
func (k EventKind) String() string { return enumName(eventNames[:], int(k), "EventKind") }

// Event is one thing the engine did. Fields a kind does not use are zero.
type Event struct {
	// Kind says what happened.
	Kind EventKind
	// Op is "do" or "dotx" for the events of a call.
	Op string
	// Topic is the outbox message's topic for the outbox events.
	Topic string
	// N is a count, as the kind says.
	N int
	// Duration is a latency, as the kind says.
	Duration time.Duration
}

// observe hands ev to the observer; unset, it costs a nil check.
func (e *Engine[T]) observe(ev Event) {
	if e.opts.Observer != nil {
		e.opts.Observer.Observe(ev)
	}
}
