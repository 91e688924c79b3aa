package idempg

import "github.com/idemkit/idem/internal/core"

// The errors of the multi-process semantics the bbolt engine does not need.
// They are the root package's idem.ErrFenced and idem.ErrLeaseLost (the
// core's sentinels), so errors.Is matches them whichever name the caller
// uses and whichever engine wrapped them.
var (
	// ErrFenced: a completion, release or renewal named a fencing token that
	// is no longer the key's, because another process took the key over after
	// this one's lease lapsed. Nothing was written: the new owner's record
	// stands. fn may have had its effect (at least once, as for any
	// takeover).
	ErrFenced = core.ErrFenced

	// ErrLeaseLost is the cause (context.Cause) of fn's context when its
	// claim could not be renewed: another process may take the key over, so
	// fn should stop.
	ErrLeaseLost = core.ErrLeaseLost

	// ErrDispatcherRunning is wrapped by the error of Dispatch while this
	// engine's dispatcher already runs (one per engine; run one engine per
	// process to drain the outbox from several).
	ErrDispatcherRunning = core.ErrDispatcherRunning
)
