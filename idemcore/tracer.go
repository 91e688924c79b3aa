package idemcore

import (
	"context"
	"errors"
	"strconv"
	"time"
)

// Tracer follows calls, their fn and outbox deliveries with a context, the
// way pgx's QueryTracer and net/http/httptrace do: each Start hook takes the
// context of what begins and returns the one it continues with (a span's,
// say), and the matching End hook gets that context back with the outcome.
// github.com/idemkit/idem/idemotel implements it for OpenTelemetry.
// Options.Tracer sets it; nil costs a nil check per call.
//
// The hooks are called synchronously on the goroutine of the call or of the
// dispatcher's worker, so they must be fast and safe for concurrent use, and
// must not call the engine. Every Start is matched by exactly one End, also
// when fn panics (End runs before the panic goes on). They receive the
// idempotency key (CallStart.Key) and the error returned, which may carry
// user data: a Tracer decides what of them it records (idemotel records
// neither by default).
type Tracer interface {
	// StartCall is called when Do or DoTx begins (after a nil fn is
	// refused, before anything else). The context it returns is the one
	// the call runs with, fn's included, and the one EndCall gets.
	StartCall(ctx context.Context, s CallStart) context.Context
	// EndCall is called once when the call returns.
	EndCall(ctx context.Context, e CallEnd)
	// StartFn is called right before fn runs, with fn's context (carrying
	// CallFrom and its lease); fn runs with the context it returns. A DoTx
	// fn may run more than once in one call (bbolt's group commit): each
	// run is its own StartFn and EndFn.
	StartFn(ctx context.Context, s FnStart) context.Context
	// EndFn is called when fn returns or panics.
	EndFn(ctx context.Context, e FnEnd)
	// StartDelivery is called before an outbox handler runs, with the
	// dispatcher's context; the handler runs with the context it returns.
	StartDelivery(ctx context.Context, s DeliveryStart) context.Context
	// EndDelivery is called once the attempt's outcome is recorded.
	EndDelivery(ctx context.Context, e DeliveryEnd)
	// MessageTrace returns the trace context to store with each outbox
	// message the DoTx call running under ctx enqueues (ctx is the one
	// StartCall returned): for example a W3C traceparent and tracestate.
	// At most MaxMessageTrace bytes are stored; a longer one, or nil,
	// stores none. The message's handler gets it back in
	// DeliveryStart.Trace (and Message.Trace).
	MessageTrace(ctx context.Context) []byte
}

// MaxMessageTrace is the most bytes of trace context stored with an outbox
// message (Message.Trace): a W3C traceparent is 55 bytes, and the W3C Trace
// Context recommends propagating at least 512 characters of tracestate.
const MaxMessageTrace = 512

// CallStart describes a call that begins (Tracer.StartCall).
type CallStart struct {
	// Op is "do" or "dotx".
	Op string
	// Key is the idempotency key, as given (not yet validated). It may carry
	// user data.
	Key string
	// Backend is the backend's name (Info.Name: "bbolt", "postgres").
	Backend string
}

// CallOutcome says how a call was answered (CallEnd.Outcome).
type CallOutcome uint8

const (
	// OutcomeExecuted: fn ran in this call, its first attempt for the key.
	// The call's error is then fn's (a recorded *Error, or a Retryable
	// one), or the engine's failure to record fn's outcome.
	OutcomeExecuted CallOutcome = iota + 1
	// OutcomeRecovered: fn ran in this call, re-executing an interrupted
	// execution (RecoverReexecute; CallEnd.Attempt is above 1).
	OutcomeRecovered
	// OutcomeReplayed: answered from a done record, fn did not run; a
	// stored error comes back as *Error with Replayed set.
	OutcomeReplayed
	// OutcomeWaited: a duplicate that waited for the call in progress with
	// its key and got that call's answer; fn did not run in this call.
	OutcomeWaited
	// OutcomeRefused: fn did not run and the engine refused the call, with
	// one of ErrInvalidKey, ErrFingerprintMismatch, ErrInProgress,
	// ErrIncomplete, ErrReentrant or ErrClosed (CallEnd.Err).
	OutcomeRefused
	// OutcomeFailed: fn did not run and the call has no answer: the store
	// failed, or the caller's context ended while the call waited.
	OutcomeFailed
)

var outcomeNames = [...]string{
	OutcomeExecuted: "executed", OutcomeRecovered: "recovered", OutcomeReplayed: "replayed",
	OutcomeWaited: "waited", OutcomeRefused: "refused", OutcomeFailed: "failed",
}

// String is the outcome's name ("executed", "recovered", "replayed",
// "waited", "refused", "failed"), or "CallOutcome(N)".
func (o CallOutcome) String() string { return enumName(outcomeNames[:], int(o), "CallOutcome") }

// enumName is names[v], or typ + "(v)" for a value without a name.
func enumName(names []string, v int, typ string) string {
	if v >= 0 && v < len(names) && names[v] != "" {
		return names[v]
	}
	return typ + "(" + strconv.Itoa(v) + ")"
}

// CallEnd describes a call that returns (Tracer.EndCall).
type CallEnd struct {
	// Op is "do" or "dotx".
	Op string
	// Outcome says how the call was answered.
	Outcome CallOutcome
	// Attempt is the execution's attempt number: this call's for
	// OutcomeExecuted and OutcomeRecovered, the recorded one for a replay
	// or a wait answered with a record; zero if none is known.
	Attempt int
	// Err is the error the call returns (nil on success): a recorded *Error
	// (fn's, possibly replayed), fn's Retryable error, a refusal, or the
	// engine's failure. EngineFailed tells the last apart.
	Err error
	// EngineFailed is set when Err is the engine's own failure (a failed
	// read or write of the store, a panic of fn, the end of the caller's
	// context while it waited, the end of fn's context): not fn's recorded
	// outcome, not a refusal.
	EngineFailed bool
	// Panicked is set when the call ends in a panic (fn's, re-raised in
	// the caller): Err is then nil, and EngineFailed set.
	Panicked bool
	// Duration is the call's wall time (real time, not Options.Now).
	Duration time.Duration
	// Wait is the part of Duration spent waiting for another call with
	// the key (in this process or, on a shared backend, another); zero if
	// the call did not wait.
	Wait time.Duration
}

// FnStart describes a run of fn that begins (Tracer.StartFn).
type FnStart struct {
	// Op is "do" or "dotx".
	Op string
	// Attempt and Recovered are CallFrom's.
	Attempt   int
	Recovered bool
	// Run counts fn's runs in this call, from 1 (a DoTx fn on bbolt with
	// its journal off may run up to 3 times; Do's fn runs once).
	Run int
}

// FnEnd describes a run of fn that ends (Tracer.EndFn).
type FnEnd struct {
	// Err is fn's error, nil if it returned none (or panicked).
	Err error
	// Panicked is set when fn panicked (or called runtime.Goexit).
	Panicked bool
	// Duration is the run's wall time (real time).
	Duration time.Duration
}

// DeliveryStart describes an outbox delivery attempt that begins
// (Tracer.StartDelivery).
type DeliveryStart struct {
	// Topic is the message's topic; Seq its sequence number.
	Topic string
	Seq   uint64
	// Attempt is the attempt in progress (Message.Attempt), from 1.
	Attempt int
	// Trace is the trace context stored with the message (Message.Trace),
	// nil if none.
	Trace []byte
	// Backend is the backend's name (Info.Name).
	Backend string
}

// DeliveryOutcome says how a delivery attempt ended (DeliveryEnd.Outcome).
type DeliveryOutcome uint8

const (
	// DeliveryDelivered: the handler succeeded and the message was removed.
	DeliveryDelivered DeliveryOutcome = iota + 1
	// DeliveryRetry: the handler failed; the message waits for its retry.
	DeliveryRetry
	// DeliveryDeadLetter: the handler failed its last attempt; the message
	// is a dead letter.
	DeliveryDeadLetter
	// DeliveryAbandoned: the attempt does not count: the dispatcher
	// stopped, the claim was lost, or the store could not record the
	// outcome; the message will be delivered again.
	DeliveryAbandoned
)

var deliveryNames = [...]string{
	DeliveryDelivered: "delivered", DeliveryRetry: "retry", DeliveryDeadLetter: "dead_letter",
	DeliveryAbandoned: "abandoned",
}

// String is the outcome's name ("delivered", "retry", "dead_letter",
// "abandoned"), or "DeliveryOutcome(N)".
func (o DeliveryOutcome) String() string {
	return enumName(deliveryNames[:], int(o), "DeliveryOutcome")
}

// DeliveryEnd describes a delivery attempt that ended (Tracer.EndDelivery).
type DeliveryEnd struct {
	// Outcome says how it ended.
	Outcome DeliveryOutcome
	// Err is the handler's error (a panic's included), nil if it succeeded.
	Err error
	// Duration is the attempt's wall time, the handler and the recording of
	// its outcome (real time).
	Duration time.Duration
}

// callTrace is what the engine keeps of one traced call; the zero value
// (no Tracer) does nothing.
type callTrace struct {
	t       Tracer
	start   time.Time
	outcome CallOutcome
	attempt int
	wait    time.Duration
	// panicked: the call is ending in a panic (fn's, re-raised).
	panicked bool
}

// startCall begins tracing a call, if a Tracer is set.
func (e *Engine[T]) startCall(ctx context.Context, ct *callTrace, op, key string) context.Context {
	t := e.opts.Tracer
	if t == nil {
		return ctx
	}
	ct.t, ct.start = t, time.Now()
	return t.StartCall(ctx, CallStart{Op: op, Key: key, Backend: e.info.Name})
}

// endCall ends the trace of a call that returns err.
func (ct *callTrace) endCall(ctx context.Context, op string, err error) {
	if ct.t == nil {
		return
	}
	end := CallEnd{Op: op, Outcome: ct.outcome, Attempt: ct.attempt, Err: err,
		Duration: time.Since(ct.start), Wait: ct.wait}
	switch {
	case end.Outcome == 0 && ct.panicked:
		end.Outcome, end.Panicked, end.EngineFailed = OutcomeFailed, true, true
	case end.Outcome == 0 && err == nil:
		end.Outcome = OutcomeFailed // not reached: every answer sets its outcome
	case end.Outcome == 0 && refusal(err):
		end.Outcome = OutcomeRefused
	case end.Outcome == 0:
		end.Outcome, end.EngineFailed = OutcomeFailed, true
	case ct.panicked:
		end.Panicked, end.EngineFailed = true, true
	case err != nil && end.Outcome != OutcomeReplayed:
		// fn's outcome (recorded, or Retryable) is not the engine's failure.
		var stored *Error
		end.EngineFailed = !errors.As(err, &stored) && !errors.Is(err, ErrRetryable)
	}
	ct.t.EndCall(ctx, end)
}

// set records how the call is answered.
func (ct *callTrace) set(o CallOutcome, attempt int) {
	if ct != nil {
		ct.outcome, ct.attempt = o, attempt
	}
}

// waited adds d to the call's wait.
func (ct *callTrace) waited(since time.Time) {
	if ct != nil && ct.t != nil {
		ct.wait += time.Since(since)
	}
}

// now is the start of a measured wait: zero without a Tracer.
func (ct *callTrace) now() time.Time {
	if ct == nil || ct.t == nil {
		return time.Time{}
	}
	return time.Now()
}

// refusal reports whether err is one of the engine's refusals
// (OutcomeRefused).
func refusal(err error) bool {
	for _, s := range [...]error{ErrInvalidKey, ErrFingerprintMismatch, ErrInProgress, ErrIncomplete, ErrReentrant, ErrClosed} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

// startFn begins tracing a run of fn, if a Tracer is set; end ends it.
func (e *Engine[T]) startFn(ctx context.Context, c *leading, op string) (context.Context, time.Time) {
	t := e.opts.Tracer
	if t == nil {
		return ctx, time.Time{}
	}
	c.runs++
	return t.StartFn(ctx, FnStart{Op: op, Attempt: c.attempt, Recovered: c.recovered, Run: c.runs}), time.Now()
}

// endFn ends the trace of a run of fn that returned err or panicked.
func (e *Engine[T]) endFn(ctx context.Context, start time.Time, err error, panicked bool) {
	if t := e.opts.Tracer; t != nil {
		t.EndFn(ctx, FnEnd{Err: err, Panicked: panicked, Duration: time.Since(start)})
	}
}

// messageTrace is the trace context for the messages of the DoTx call
// running under ctx: at most MaxMessageTrace bytes, else none.
func (e *Engine[T]) messageTrace(ctx context.Context) []byte {
	t := e.opts.Tracer
	if t == nil {
		return nil
	}
	b := t.MessageTrace(ctx)
	if len(b) == 0 || len(b) > MaxMessageTrace {
		return nil
	}
	return b
}
