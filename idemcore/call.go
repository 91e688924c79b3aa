package idemcore

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/idemkit/idem/internal/fault"
	"github.com/idemkit/idem/internal/goid"
)

// leading is the state of the call that leads a key.
type leading struct {
	op        string
	flight    *flight
	key       string
	fp        uint64
	attempt   int
	recovered bool
	prev      *Record // the interrupted execution being recovered, if any
	claim     *Claim  // the key's claim once taken, for the heartbeat
	// end is how the call ends for its waiters (see leaderEnd).
	end leaderEnd
	// current is the record the backend reported when it answered
	// errRedecide, nil if it was not live (judged at the backend's reading).
	current *Record
	// trace learns the call's outcome for the Tracer (its t nil without
	// one); lead hands it to the call's own.
	trace callTrace
	// runs counts fn's runs, for the Tracer.
	runs int
	// first: the call claims without having read the key's record
	// (claimFirst); the claim reads it.
	first bool
}

// executed is the outcome of a call whose fn runs.
func (c *leading) executed() CallOutcome {
	if c.recovered {
		return OutcomeRecovered
	}
	return OutcomeExecuted
}

// Do runs fn once per idempotency key and records its outcome, so that every
// later call with the key gets that outcome back (Result.Replayed) instead of
// running fn again; concurrent calls with the key wait for the first. It
// returns fn's response, or fn's permanent error as an *Error (replayed with
// its Code and Message). Errors: ErrInvalidKey for a key that breaks the key
// rules, ErrFingerprintMismatch for a reused key with another fingerprint,
// ErrInProgress (InFlightFail), ErrIncomplete for an interrupted execution
// this engine refuses, ErrReentrant for a call that would wait for itself,
// ErrResponseTooLarge, ErrClosed after Close, a waiter's ctx.Err(); each
// inside an *OpError. A nil fn is refused, and nothing is stored. The
// package documentation gives the outcomes case by case.
func (e *Engine[T]) Do(ctx context.Context, key string, fingerprint []byte, fn func(context.Context) ([]byte, error)) (Result, error) {
	if fn == nil {
		return Result{}, &OpError{Op: "do", Key: key, Err: errNilFn}
	}
	exec := func(ctx context.Context, c *leading) (Result, error) { return e.execute(ctx, c, fn) }
	if e.opts.Tracer != nil {
		return e.traced(ctx, "do", key, fingerprint, exec)
	}
	res, err := e.call(ctx, nil, "do", key, fingerprint, exec)
	return res, OpErr("do", key, err)
}

// DoTx is Do for effects that live in the backend's store: fn writes through
// tx, the backend's own transaction T (a bbolt write transaction, a pgx.Tx),
// and its writes, its outbox messages and the done record commit together,
// or nothing does. It returns and fails as Do does; if fn panics, the panic
// is re-raised in the caller as a *PanicError. Engine calls from inside fn
// return ErrReentrant where the transaction holds the store's writer. The
// package documentation gives the outcomes, and Backend.RunTx how many times
// fn may run.
func (e *Engine[T]) DoTx(ctx context.Context, key string, fingerprint []byte, fn func(context.Context, T) ([]byte, error)) (Result, error) {
	if fn == nil {
		return Result{}, &OpError{Op: "dotx", Key: key, Err: errNilFn}
	}
	exec := func(ctx context.Context, c *leading) (Result, error) { return e.executeTx(ctx, c, fn) }
	if e.opts.Tracer != nil {
		return e.traced(ctx, "dotx", key, fingerprint, exec)
	}
	res, err := e.call(ctx, nil, "dotx", key, fingerprint, exec)
	return res, OpErr("dotx", key, err)
}

// traced is call under Options.Tracer: StartCall before, EndCall after, also
// when fn's panic goes through.
func (e *Engine[T]) traced(ctx context.Context, op, key string, fingerprint []byte,
	exec func(context.Context, *leading) (Result, error)) (res Result, err error) {
	var ct callTrace
	ctx = e.startCall(ctx, &ct, op, key)
	returned := false
	defer func() {
		ct.panicked = !returned
		ct.endCall(ctx, op, err)
	}()
	res, err = e.call(ctx, &ct, op, key, fingerprint, exec)
	err = OpErr(op, key, err)
	returned = true
	return res, err
}

// call is the part of Do and DoTx before execution: validation, the replay
// fast path, the singleflight, and the state machine on the stored record.
// ct, if not nil, learns the call's outcome for the Tracer.
func (e *Engine[T]) call(ctx context.Context, ct *callTrace, op, key string, fingerprint []byte,
	exec func(context.Context, *leading) (Result, error)) (Result, error) {
	if err := ValidateKey(key); err != nil {
		return Result{}, &OpError{Op: op, Key: key, Err: err}
	}
	if err := e.reentrant(ctx, key); err != nil {
		return Result{}, &OpError{Op: op, Key: key, Err: err}
	}
	// Closed first: after Close a call says ErrClosed, whatever the guard
	// (a failed commit's ErrStorageFailed) would say.
	if err := e.enter(); err != nil {
		return Result{}, &OpError{Op: op, Key: key, Err: err}
	}
	defer e.calls.Done()
	if err := e.guard(); err != nil {
		return Result{}, &OpError{Op: op, Key: key, Err: err}
	}
	fp := xxhash.Sum64(fingerprint)

	// The fast path: a done record answers without the per-key lock, after
	// the fingerprint check, from memory if it completed recently.
	now := e.now()
	if rec, ok := e.cached(key, now); ok {
		return e.replay(ct, op, rec, fp, true)
	}
	gen := e.locks.generation()
	var rec *Record
	first := e.claimFirst(op)
	if !first {
		var err error
		rec, err = e.lookup(ctx, key, fp, true, now)
		if e.canClaimFirst(op) {
			e.found.add(rec != nil || err == ErrFingerprintMismatch)
		}
		if err != nil {
			if err == ErrFingerprintMismatch {
				return Result{}, e.conflict(op, key, nil)
			}
			return Result{}, err
		}
		if rec != nil && rec.State == StateDone {
			return e.replay(ct, op, rec, fp, false)
		}
	}

	for {
		f, leader := e.locks.acquire(key, fp, now)
		if !leader {
			if err := e.selfWait(f); err != nil {
				return Result{}, &OpError{Op: op, Key: key, Err: err}
			}
			if f.fp != fp {
				if f.executing.Load() {
					return Result{}, e.conflict(op, key, errors.New("the call in progress has another fingerprint"))
				}
				// The leader has not claimed the key with its fingerprint (it
				// may be answering from a record of ours, or be an operator):
				// its outcome is not ours. Wait for it, then look again.
				since := ct.now()
				err := f.wait(ctx)
				ct.waited(since)
				if err != nil {
					return Result{}, err
				}
				continue
			}
			if e.opts.InFlight == InFlightFail {
				e.observe(Event{Kind: EventInProgress, Op: op})
				return Result{}, &OpError{Op: op, Key: key, Err: &InProgressError{StartedAt: f.started, RetryAfter: e.opts.RetryAfter}}
			}
			if err := fault.Err("do-wait"); err != nil {
				return Result{}, &OpError{Op: op, Key: key, Err: err} // as if the wait failed
			}
			e.observe(Event{Kind: EventWait, Op: op})
			since := ct.now()
			err := f.wait(ctx)
			ct.waited(since)
			if err != nil {
				return Result{}, err
			}
			switch f.end {
			case endAgain:
				continue
			case endIncomplete:
				return Result{}, &OpError{Op: op, Key: key, Err: fmt.Errorf("%w: the leading call ended without an outcome", ErrIncomplete)}
			}
			// fn did not run in this call: the answer is a replay of the
			// leader's, in copies of its own.
			res, err := f.res, f.err
			ct.set(OutcomeWaited, res.Attempt)
			res.Response, res.Replayed = cloneBytes(res.Response), true
			if ie, ok := err.(*Error); ok {
				cp := *ie
				cp.Replayed = true
				err = &cp
			}
			return res, err
		}
		// The record read above is still current if no call has released
		// a key since (every write of a record happens under its key);
		// otherwise the leader reads it again.
		// (With nothing read, as Do on a ClaimFirst backend, the claim reads.)
		stale := !first && e.locks.generation() != gen
		return e.lead(ctx, ct, op, key, fp, f, rec, stale, first, exec)
	}
}

// lead runs the state machine for the leader and publishes its outcome to
// the waiters, also when exec panics or calls runtime.Goexit. rec is the
// key's record as read before the key was taken; stale asks to read it again;
// first says nothing was read (claimFirst).
// Everything after acquire runs here, under the deferred release, so no path
// leaves the flight registered.
func (e *Engine[T]) lead(ctx context.Context, ct *callTrace, op, key string, fp uint64, f *flight, rec *Record, stale, first bool,
	exec func(context.Context, *leading) (Result, error)) (res Result, err error) {
	c := &leading{op: op, key: key, fp: fp, attempt: 1, flight: f, first: first}
	if ct != nil {
		c.trace.t = ct.t
	}
	returned := false
	defer func() {
		if ct != nil {
			ct.outcome, ct.attempt, ct.wait = c.trace.outcome, c.trace.attempt, ct.wait+c.trace.wait
		}
		if !returned && c.end == endAnswer {
			c.end = endIncomplete // a panic or runtime.Goexit
		}
		f.end = c.end
		if c.end == endAnswer {
			f.res, f.err = res, err
		}
		e.locks.release(key, f)
	}()
	var loadErr error
	if stale {
		rec, loadErr = e.lookup(ctx, key, 0, false, e.now())
	}
	res, err = e.decide(ctx, c, rec, loadErr, exec)
	returned = true
	return res, err
}

// decide applies the state machine to rec, the key's record read by the
// leader (err: the read failed), and again to each record the backend
// reports instead while claiming.
func (e *Engine[T]) decide(ctx context.Context, c *leading, rec *Record, err error,
	exec func(context.Context, *leading) (Result, error)) (Result, error) {
	for {
		if err != nil {
			c.end = endAgain
			return Result{}, err
		}
		res, err := e.decideOnce(ctx, c, rec, exec)
		if err != errRedecide {
			return res, err
		}
		c.attempt, c.recovered, c.prev, c.claim, c.end = 1, false, nil, nil, endAnswer
		c.trace.set(0, 0)
		rec = c.current // live, or nil: judged where it was read
	}
}

// decideOnce is one turn of the decision table: no record → execute; done →
// replay; started → the backend's ownership rule: owned elsewhere → wait or
// InProgressError; an orphan → recover (RecoverReexecute) or ErrIncomplete
// (RecoverRefuse).
func (e *Engine[T]) decideOnce(ctx context.Context, c *leading, rec *Record,
	exec func(context.Context, *leading) (Result, error)) (Result, error) {
	if rec != nil {
		if rec.Fingerprint != c.fp {
			return Result{}, e.conflict(c.op, c.key, nil)
		}
		if rec.State == StateDone {
			return e.replay(&c.trace, c.op, rec, c.fp, false)
		}
		own, err := e.b.Owner(ctx, rec)
		if err != nil {
			c.end = endAgain
			return Result{}, &OpError{Op: c.op, Key: c.key, Err: err}
		}
		if own.Owned {
			return e.ownedElsewhere(ctx, c, rec)
		}
		if e.opts.Recovery == RecoverRefuse {
			return Result{}, &OpError{Op: c.op, Key: c.key, Err: fmt.Errorf("%w: interrupted execution (attempt %d, started %s); resolve or forget the key",
				ErrIncomplete, rec.Attempt, rec.StartedAt.UTC().Format(time.RFC3339))}
		}
		c.attempt, c.recovered, c.prev = rec.Attempt+1, true, rec
		e.log.Debug("idem: re-executing an interrupted execution", "attempt", c.attempt)
	}
	if err := ctx.Err(); err != nil {
		c.end = endAgain
		return Result{}, err
	}
	if !c.first || c.prev != nil {
		c.flight.executing.Store(true) // the key is claimed with c.fp: others conflict at once
	} // else: once Claim took the key (claim), not from a record unread
	return exec(ctx, c)
}

// claimFirst reports whether op's leader is to claim the key without
// reading its record first (Info.ClaimFirst): Do and DoTx on such a
// backend, unless most recent calls found a record (foundRate). DoTx's
// claim of a free key is made inside RunTx's transaction, which answers a
// record it finds with ErrClaimTaken (a rollback, then the Lookup): worth
// it only while most keys are fresh, as foundRate decides.
func (e *Engine[T]) claimFirst(op string) bool { return e.canClaimFirst(op) && !e.found.mostly() }

// canClaimFirst reports whether op's leader may claim first: Do and DoTx
// on a backend with Info.ClaimFirst. Their calls feed foundRate.
func (e *Engine[T]) canClaimFirst(op string) bool {
	return e.info.ClaimFirst && (op == "do" || op == "dotx")
}

// ownedElsewhere answers for a started record that a live owner in another
// process holds: never recovered. rec is that record, or nil when the
// backend reported the key owned without a record to show (Postgres: a
// started row another process's transaction holds, not yet committed); the
// InProgressError's StartedAt is then zero. Under InFlightFail it is an
// *InProgressError; under InFlightWait the leader waits for the record to
// change, then decides again.
func (e *Engine[T]) ownedElsewhere(ctx context.Context, c *leading, rec *Record) (Result, error) {
	if e.opts.InFlight == InFlightFail {
		e.observe(Event{Kind: EventInProgress, Op: c.op})
		var started time.Time
		if rec != nil {
			started = rec.StartedAt
		}
		return Result{}, &OpError{Op: c.op, Key: c.key, Err: &InProgressError{StartedAt: started, RetryAfter: e.opts.RetryAfter}}
	}
	if err := fault.Err("do-wait"); err != nil {
		c.end = endAgain // as if the wait failed
		return Result{}, &OpError{Op: c.op, Key: c.key, Err: err}
	}
	e.observe(Event{Kind: EventWait, Op: c.op})
	since := c.trace.now()
	err := e.b.WaitChange(ctx, c.key)
	c.trace.waited(since)
	if err != nil {
		c.end = endAgain
		return Result{}, err
	}
	cur, err := e.lookup(ctx, c.key, 0, false, e.now())
	if err != nil {
		c.end = endAgain
		return Result{}, err
	}
	c.current = cur
	return Result{}, errRedecide
}

// startedRecord is the started record of c's attempt.
func (e *Engine[T]) startedRecord(c *leading) *Record {
	// The backend carries over the mark and the longer window of the
	// interrupted execution a claim takes over (ClaimRequest.Prev).
	return &Record{Key: c.key, State: StateStarted, Fingerprint: c.fp, Attempt: c.attempt, StartedAt: e.now(),
		Retention: e.opts.Retention, KeptUntilResolved: e.opts.Recovery == RecoverRefuse}
}

// claim takes c's key with started (Backend.Claim). A claim the backend
// answers otherwise sends the leader back to decide.
func (e *Engine[T]) claim(ctx context.Context, c *leading, started *Record) (*Claim, error) {
	cr, err := e.b.Claim(ctx, ClaimRequest{Started: started, Prev: c.prev})
	if err != nil {
		c.end = endAgain
		return nil, e.writeErr(c.op, c.key, err)
	}
	if c.first && c.prev == nil {
		e.found.add(cr.Status != Claimed)
	}
	switch cr.Status {
	case Claimed:
		c.claim = cr.Claim
		c.flight.executing.Store(true)
		return cr.Claim, nil
	case ClaimOwned:
		// Taken meanwhile by a live owner elsewhere: wait for it or refuse,
		// as for a record Owner reports owned. With no interrupted execution
		// to take over (c.prev nil), the owner's record is not visible yet.
		_, err := e.ownedElsewhere(ctx, c, c.prev)
		return nil, err
	default:
		cur, at := cr.Current, cr.At
		if at.IsZero() {
			at = e.now()
		}
		if cur != nil && !e.live(cur, at) {
			if cur.State == StateStarted {
				// Past its window, yet not claimed: a backend whose claims
				// honour a live lease (Postgres) refused it, as a call of
				// another process still runs past its retention. Owned
				// elsewhere, it is not absent: claiming again would spin
				// until that call ends.
				own, err := e.b.Owner(ctx, cur)
				if err != nil {
					c.end = endAgain
					return nil, &OpError{Op: c.op, Key: c.key, Err: err}
				}
				if own.Owned {
					_, err := e.ownedElsewhere(ctx, c, cur)
					return nil, err
				}
			}
			cur = nil
		}
		c.current = cur
	}
	return nil, errRedecide
}

// unclaim gives the key back after the caller's context ended before fn
// started: back to the interrupted execution it recovered, or free.
func (e *Engine[T]) unclaim(ctx context.Context, c *leading, cl *Claim) {
	if err := e.b.Release(context.WithoutCancel(ctx), cl, c.prev); err != nil {
		e.log.Warn("idem: cannot remove a started record after cancellation", "err", err)
	}
}

// execute is Do's execution: claim (a started record committed), fn, done
// commit.
func (e *Engine[T]) execute(ctx context.Context, c *leading, fn func(context.Context) ([]byte, error)) (Result, error) {
	if e.b.Holding() {
		c.end = endAgain
		return Result{}, &OpError{Op: "do", Key: c.key, Err: errInsideDoTx}
	}
	started := e.startedRecord(c)
	if err := fault.Err("do-before-started"); err != nil {
		c.end = endAgain // as if the started commit failed: nothing stored
		return Result{}, e.writeErr("do", c.key, err)
	}
	cl, err := e.claim(ctx, c, started)
	if err != nil {
		return Result{}, err
	}
	if err := fault.Err("do-after-started"); err != nil {
		// As a cancellation before fn starts: put the key back as it was.
		c.end = endAgain
		e.unclaim(ctx, c, cl)
		return Result{}, e.writeErr("do", c.key, err)
	}
	if err := ctx.Err(); err != nil {
		// fn has not started: put the key back as it was.
		c.end = endAgain
		e.unclaim(ctx, c, cl)
		return Result{}, err
	}

	e.observe(Event{Kind: EventExecution, Op: "do", N: c.attempt})
	c.trace.set(c.executed(), c.attempt)
	e.n.Executions.Add(1)
	c.flight.runner.Store(goid.ID()) // fn runs here: see selfWait
	returned := false
	defer func() {
		if !returned { // fn panicked or called runtime.Goexit
			e.lapse(ctx, cl)
		}
	}()
	resp, ferr, ended := e.runFn(ctx, c, fn)
	returned = true

	// Once fn has returned, its outcome is recorded even if ctx ends. A
	// failed call's Result carries no response: fn's bytes are an answer
	// only once stored (firstAnswer).
	wctx := context.WithoutCancel(ctx)
	res := Result{Attempt: c.attempt, StartedAt: started.StartedAt}
	if err := fault.Err("do-after-fn"); err != nil {
		// As a failed done commit: fn ran, the started record stays.
		c.end = endIncomplete
		return res, e.writeErr("do", c.key, err)
	}
	switch {
	case errors.Is(ferr, ErrRetryable) && c.prev != nil:
		// fn's promise covers this attempt only: the earlier attempt's effect
		// is still unknown, so this attempt's started record stays, and the
		// next call recovers with the attempt after it.
		return res, ferr
	case errors.Is(ferr, ErrRetryable):
		if err := e.b.Release(wctx, cl, nil); err != nil {
			c.end = endIncomplete
			return res, errors.Join(ferr, e.writeErr("do", c.key, err))
		}
		return res, ferr
	case ferr != nil && ended:
		// fn's own context ended (the caller's ctx or Close): its error is an
		// interruption, not an outcome. A context error fn made itself (a
		// downstream timeout) while its context was live is an outcome.
		c.end = endIncomplete
		e.lapse(ctx, cl)
		return res, ferr
	}
	done := e.doneRecord(started, resp, ferr)
	if err := e.b.Complete(wctx, cl, done); err != nil {
		c.end = endIncomplete
		return res, e.writeErr("do", c.key, err)
	}
	if err := fault.Err("do-after-done"); err != nil {
		// As an ambiguous commit: done is stored, the caller is not told;
		// waiters lead again and replay it.
		c.end = endAgain
		return res, e.writeErr("do", c.key, err)
	}
	e.remember(done)
	return e.firstAnswer(done, resp, ferr)
}

// lapse ends cl's lease at once, after fn ended without an outcome in this
// live process (it panicked, or returned after its context ended): nobody
// runs fn for the key any more, so another process may recover it without
// waiting a lease out. The started record stays (an interrupted execution,
// with the window and mark the claim stored): Release restores it with a
// lapsed lease and a token no claim holds. Only for a backend whose claims
// lease (Info().Heartbeat); a failure (ErrFenced: another owner took the
// key over after a lost lease) is logged, and leaves the lease to lapse.
func (e *Engine[T]) lapse(ctx context.Context, cl *Claim) {
	if e.info.Heartbeat <= 0 || cl == nil || cl.Token == 0 || cl.Started == nil {
		return
	}
	rec := *cl.Started
	if p := cl.Prev; p != nil {
		rec.Retention = max(rec.Retention, p.Retention)
		rec.KeptUntilResolved = rec.KeptUntilResolved || p.KeptUntilResolved
	}
	// Bounded: a backend that cannot be reached (retrying on fresh
	// connections) must not hold up the caller, or a panic, for long.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.info.Heartbeat)
	defer cancel()
	if err := e.b.Release(rctx, cl, &rec); err != nil {
		e.log.Debug("idem: cannot end the lease of an ended fn; it lapses on its own", "err", err)
	}
}

// runFn runs Do's fn in its context, and releases that context (its
// registration on the engine's) on every path: a panic or runtime.Goexit in fn
// included. ended reports whether fn's own context had ended (the caller's
// ctx, Stop, or a lost lease) when fn returned, read before the stop that
// cancels it.
func (e *Engine[T]) runFn(ctx context.Context, c *leading, fn func(context.Context) ([]byte, error)) (resp []byte, ferr error, ended bool) {
	fnCtx, stop := e.fnContext(ctx, c, false)
	defer stop()
	if e.opts.Tracer == nil {
		resp, ferr = fn(fnCtx)
		return resp, ferr, fnCtx.Err() != nil
	}
	tctx, start := e.startFn(fnCtx, c, "do")
	returned := false
	defer func() {
		if !returned { // fn panicked or called runtime.Goexit
			e.endFn(tctx, start, nil, true)
		}
	}()
	resp, ferr = fn(tctx)
	returned = true
	e.endFn(tctx, start, ferr, false)
	return resp, ferr, fnCtx.Err() != nil
}

// errRolledBack marks a DoTx fn outcome that must not commit: the backend
// rolls the transaction back and the engine records the outcome on its own.
var errRolledBack = errors.New("idem: fn's writes rolled back")

// executeTx is DoTx's execution: fn and the done record in one transaction
// of the backend's (RunTx); a permanent error recorded alone.
func (e *Engine[T]) executeTx(ctx context.Context, c *leading, fn func(context.Context, T) ([]byte, error)) (Result, error) {
	if e.b.Holding() {
		c.end = endAgain
		return Result{}, &OpError{Op: "dotx", Key: c.key, Err: errInsideDoTx}
	}
	started := e.startedRecord(c)
	// cl is this call's claim while fn runs: made inside RunTx for a new key
	// (Token zero); when recovering an interrupted execution, a started
	// record of this attempt, committed first (as Do does), so that however
	// this attempt ends the evidence of the earlier unknown outcome stays and
	// its attempt number is not given out again.
	cl := &Claim{Key: c.key, Fingerprint: c.fp}
	recovering := c.prev != nil
	if recovering {
		var err error
		if cl, err = e.claim(ctx, c, started); err != nil {
			return Result{}, err
		}
		if err := ctx.Err(); err != nil {
			// fn has not started: put the key back as it was.
			c.end = endAgain
			e.unclaim(ctx, c, cl)
			return Result{}, err
		}
	}
	// lost marks this call as ending without an outcome: waiters get
	// ErrIncomplete if an interrupted execution stands, else they try to
	// lead (nothing was stored, the key is free).
	lost := func() {
		if recovering {
			c.end = endIncomplete
		} else {
			c.end = endAgain
		}
	}
	fnCtx, stop := e.fnContext(ctx, c, true)
	defer stop()
	var (
		resp    []byte
		ferr    error
		ended   bool // fn's own context had ended when it returned
		fnPanic *PanicError
		done    *Record
	)
	e.observe(Event{Kind: EventExecution, Op: "dotx", N: c.attempt})
	c.trace.set(c.executed(), c.attempt)
	cl.Trace = e.messageTrace(ctx)
	e.n.Executions.Add(1)
	lost() // until the backend answers: fn may call runtime.Goexit
	wctx := context.WithoutCancel(ctx)
	err := e.b.RunTx(wctx, cl, func(tx T) (*Record, error) {
		done = nil // fn may run again: only the last run's outcome counts
		if c.first {
			c.flight.executing.Store(true) // RunTx claimed the key: see decideOnce
		}
		tctx, start := e.startFn(fnCtx, c, "dotx")
		resp, ferr, fnPanic = callTx(tctx, tx, fn)
		e.endFn(tctx, start, ferr, fnPanic != nil)
		ended = fnCtx.Err() != nil // before stop, which cancels fnCtx
		if t := e.info.Transient; ferr != nil && t != nil && !errors.Is(ferr, ErrRetryable) && t(ferr) {
			ferr = Retryable(ferr) // the database's "try again": not an outcome
		}
		if fnPanic != nil {
			return nil, errRolledBack
		}
		// fn may return bytes read from tx: they may point into the
		// backend's memory (bbolt's map) and be invalid once it ends.
		resp = cloneBytes(resp)
		if ferr != nil {
			return nil, errRolledBack
		}
		done = e.doneRecord(started, resp, nil)
		if done.Err != nil { // too large: fail closed without fn's writes
			return nil, errRolledBack
		}
		if err := fault.Err("dotx-before-commit"); err != nil {
			return nil, err // as a failed write in the transaction: it rolls back
		}
		return done, nil
	})
	c.end = endAnswer
	if c.first && !recovering {
		e.found.add(errors.Is(err, ErrClaimTaken)) // RunTx's claim read the key: feed foundRate, as Do's claim does
	}
	res := Result{Attempt: c.attempt, StartedAt: started.StartedAt} // no response unless stored, as for Do
	switch {
	case err == nil:
		if err := fault.Err("dotx-after-commit"); err != nil {
			// As an ambiguous commit: fn's writes and done are stored, the
			// caller is not told; waiters lead again and replay it.
			c.end = endAgain
			return res, e.writeErr("dotx", c.key, err)
		}
		e.remember(done)
		return e.firstAnswer(done, resp, nil)
	case fnPanic != nil:
		lost()
		if recovering {
			e.lapse(ctx, cl)
		}
		panic(fnPanic)
	case errors.Is(err, ErrClaimTaken) && !recovering:
		// Another process claimed the key meanwhile: nothing was written.
		cur, lerr := e.lookup(ctx, c.key, 0, false, e.now())
		if lerr != nil {
			c.end = endAgain
			return res, lerr
		}
		if cur == nil {
			// Claimed but not visible: another process's transaction holds
			// the key's row, uncommitted. Owned elsewhere: wait or refuse.
			c.end = endAnswer
			return e.ownedElsewhere(ctx, c, nil)
		}
		c.current = cur
		return Result{}, errRedecide
	case err != errRolledBack:
		// The commit failed (a write error, or a panic of the backend's or
		// of the engine's own code in it): nothing of fn's committed.
		lost()
		return res, e.writeErr("dotx", c.key, err)
	case errors.Is(ferr, ErrRetryable):
		// Nothing of fn's committed. A new key is free; a recovery keeps its
		// started record, since fn's promise covers this attempt only.
		// Waiters get the same error and may retry at once.
		return res, ferr
	case ferr != nil && ended:
		// fn's own context ended (the caller's ctx or Close): its error is an
		// interruption, not an outcome; a context error fn made itself
		// while its context was live is a permanent error.
		lost()
		if recovering {
			e.lapse(ctx, cl)
		}
		return res, ferr
	}
	// A permanent error or an oversized response: record it alone.
	if done == nil || done.Err == nil {
		done = e.doneRecord(started, resp, ferr)
	}
	if recovering {
		err = e.b.Complete(wctx, cl, done)
	} else {
		err = e.b.RunTx(wctx, cl, func(T) (*Record, error) { return done, nil })
	}
	if err != nil {
		lost()
		return res, e.writeErr("dotx", c.key, err)
	}
	e.remember(done)
	return e.firstAnswer(done, resp, ferr)
}

// callTx runs a DoTx fn, turning its panic into a *PanicError with the stack
// where it panicked, so that a panic of fn is told apart from one of the
// engine or the backend inside the same commit.
func callTx[T any](ctx context.Context, tx T, fn func(context.Context, T) ([]byte, error)) (resp []byte, err error, pe *PanicError) {
	defer func() {
		if v := recover(); v != nil {
			pe = &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	resp, err = fn(ctx, tx)
	return resp, err, nil
}

// doneRecord builds the done record for fn's outcome, failing closed on a
// response over the limit.
func (e *Engine[T]) doneRecord(started *Record, resp []byte, ferr error) *Record {
	done := *started
	done.State, done.CompletedAt, done.Response = StateDone, e.now(), resp
	done.KeptUntilResolved = false
	var code, msg string
	if ferr != nil {
		code, msg = errorCode(ferr), ferr.Error()
	}
	// The limit covers what is stored: the response and the error's text.
	if max, n := e.opts.MaxResponseSize, len(resp)+len(code)+len(msg); max > 0 && n > max {
		done.Response = nil
		done.Err = &Error{Code: codeResponseTooLarge,
			Message: fmt.Sprintf("response and error of %d bytes exceed the limit of %d bytes", n, max)}
	} else if ferr != nil {
		done.Err = &Error{Code: code, Message: msg}
	}
	return &done
}

// firstAnswer is the caller's answer once done is committed: the record as a
// replay would give it, except that the error wraps fn's own.
func (e *Engine[T]) firstAnswer(done *Record, resp []byte, ferr error) (Result, error) {
	res := Result{Response: done.Response, Attempt: done.Attempt, StartedAt: done.StartedAt, CompletedAt: done.CompletedAt}
	if done.Err == nil {
		return res, nil
	}
	out := *done.Err
	if out.Code != codeResponseTooLarge {
		out.err = ferr
	}
	return res, &out
}

// replay answers from a done record. A record shared with the cache is
// copied: each caller gets its own response bytes and its own *Error. A
// record just decoded by the backend is the caller's already.
func (e *Engine[T]) replay(ct *callTrace, op string, rec *Record, fp uint64, shared bool) (Result, error) {
	if rec.Fingerprint != fp {
		return Result{}, e.conflict(op, rec.Key, nil)
	}
	ct.set(OutcomeReplayed, rec.Attempt)
	e.n.Replays.Add(1)
	e.observe(Event{Kind: EventReplay, Op: op})
	res := Result{Response: rec.Response, Replayed: true, Attempt: rec.Attempt, StartedAt: rec.StartedAt, CompletedAt: rec.CompletedAt}
	if !shared {
		if rec.Err != nil {
			return res, rec.Err
		}
		return res, nil
	}
	res.Response = cloneBytes(rec.Response)
	if rec.Err != nil {
		err := *rec.Err
		return res, &err
	}
	return res, nil
}

// conflict counts a fingerprint mismatch on key and returns its error, with
// why (if not nil) as the detail.
func (e *Engine[T]) conflict(op, key string, why error) error {
	e.n.Conflicts.Add(1)
	e.observe(Event{Kind: EventConflict, Op: op})
	err := ErrFingerprintMismatch
	if why != nil {
		err = fmt.Errorf("%w: %v", ErrFingerprintMismatch, why)
	}
	return &OpError{Op: op, Key: key, Err: err}
}

// remember puts a just-committed done record in the replay cache, as a
// replay from the backend would see it: its own copy of the response.
func (e *Engine[T]) remember(done *Record) {
	if e.cache == nil {
		return
	}
	r := *done
	r.Response = cloneBytes(done.Response)
	if done.Err != nil {
		stored := Error{Code: done.Err.Code, Message: done.Err.Message, Replayed: true}
		r.Err = &stored
	}
	e.cache.put(&r)
}

// lookup reads key's live record at now (at the backend's reading of its
// clock, if it has one: Info.Clock), or nil if it has none or it expired.
// With check set, a live done record of another fingerprint than fp may come
// back as ErrFingerprintMismatch, unwrapped.
func (e *Engine[T]) lookup(ctx context.Context, key string, fp uint64, check bool, now time.Time) (*Record, error) {
	rec, at, err := e.b.Lookup(ctx, Lookup{Key: key, Now: now, Retention: e.opts.Retention, Fingerprint: fp, CheckFingerprint: check})
	if err != nil || rec == nil {
		return nil, err
	}
	if !at.IsZero() {
		now = at
	}
	if !e.live(rec, now) {
		return nil, nil
	}
	return rec, nil
}

// writeErr wraps a backend's write error for op on key.
func (e *Engine[T]) writeErr(op, key string, err error) error {
	return OpErr(op, key, err)
}
