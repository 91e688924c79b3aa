package idemcore

import (
	"cmp"
	"context"
	"time"
)

// PruneBatch bounds the records a backend deletes per write transaction
// when the engine prunes, and the dead letters, unless its Info.PruneBatch
// says otherwise.
const PruneBatch = 1000

// Expired reports whether r is expired under q: not live at q.Now by the
// longer of its own window and q.Retention, and not a started record kept
// (marked KeptUntilResolved, or any started record under q.KeepStarted).
// Backend.Prune deletes exactly these.
func (q PruneRequest) Expired(r *Record) bool {
	if r.State == StateStarted && (r.KeptUntilResolved || q.KeepStarted) {
		return false
	}
	return !q.Now.Before(Expiry(r, q.Retention))
}

// Prune reclaims the space of expired records now (Backend.Prune), then of
// the dead letters past their retention (Backend.PruneDead), and returns how
// many records it removed. A record expires the longer of the retention
// window it was written under and Options.Retention after it completed
// (after it started, while started: Expiry); a started record written under
// RecoverRefuse, or any started record while this engine refuses, never
// expires. When interrupted executions were among the records removed, their
// count (never their keys) is logged at warn level: their keys are new
// again. A failure to prune dead letters is logged, not returned. Readers
// treat expired records as absent whether or not Prune has run; Prune stops
// early with ctx.Err().
func (e *Engine[T]) Prune(ctx context.Context) (int, error) {
	if err := e.Enter(); err != nil {
		return 0, &OpError{Op: "prune", Err: err}
	}
	defer e.calls.Done()
	return e.prune(ctx)
}

// prune is Prune without the entry checks, for the background pruner too.
// Prune and the pruner take turns.
func (e *Engine[T]) prune(ctx context.Context) (int, error) {
	e.pruneMu.Lock()
	defer e.pruneMu.Unlock()
	var r PruneResult
	if o := e.opts.Observer; o != nil {
		defer func(start time.Time, r *PruneResult) {
			o.Observe(Event{Kind: EventPrune, N: r.Deleted, Duration: time.Since(start)})
		}(time.Now(), &r)
	}
	limit := cmp.Or(e.info.PruneBatch, PruneBatch)
	now, err := e.clock(ctx)
	if err != nil {
		return 0, OpErr("prune", "", err)
	}
	r, err = e.b.Prune(ctx, PruneRequest{Now: now, Retention: e.opts.Retention,
		KeepStarted: e.opts.Recovery == RecoverRefuse, Limit: limit})
	e.n.Pruned.Add(uint64(r.Deleted))
	if r.Interrupted > 0 {
		e.log.Warn("idem: pruned interrupted executions past the retention window; their keys run as new, not recovered",
			"interrupted", r.Interrupted, "retention", e.opts.Retention)
	}
	if err != nil {
		return r.Deleted, OpErr("prune", "", err)
	}
	n, err := e.b.PruneDead(ctx, func(m *Message) bool { return e.ob.deadExpired(m, now) }, limit)
	switch {
	case err != nil && ctx.Err() == nil:
		e.log.Warn("idem: pruning dead letters failed", "err", err)
	case n > 0:
		e.log.Debug("idem: pruned expired dead letters", "messages", n)
	}
	return r.Deleted, nil
}

// pruneLoop is the background pruner: Prune every interval, until Stop.
func (e *Engine[T]) pruneLoop(every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-e.ctx.Done():
			return
		case <-t.C:
			n, err := e.prune(e.ctx)
			switch {
			case err != nil && e.ctx.Err() == nil:
				e.log.Warn("idem: prune failed", "err", err)
			case n > 0:
				e.log.Debug("idem: pruned expired records", "records", n)
			}
		}
	}
}
