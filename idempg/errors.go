package idempg

import (
	"errors"

	"github.com/idemkit/idem/idemcore"
)

// ErrTxEnded is wrapped by the error of a DoTx whose fn ended the
// transaction it was given: tx.Commit or tx.Rollback (which refuse, since
// the transaction is the engine's), or COMMIT, ROLLBACK, END, COMMIT AND
// CHAIN sent as SQL through tx. No outcome is stored for the call: the
// engine cannot vouch for what committed (or rolled back) outside it. What
// fn wrote before a COMMIT it sent stays committed, with the call's started
// record (an interrupted execution, taken over after its lease as any
// other); after a ROLLBACK nothing of the call is left. Other DoTx calls
// that shared the transaction are answered by reading their records back.
var ErrTxEnded = errors.New("idempg: a DoTx fn must not end its transaction (the engine commits it, with the done record)")

// The errors of the multi-process semantics the bbolt engine does not need.
// They are the root package's idemcore.ErrFenced and idemcore.ErrLeaseLost (the
// core's sentinels), so errors.Is matches them whichever name the caller
// uses and whichever engine wrapped them.
var (
	// ErrFenced: a completion, release or renewal named a fencing token that
	// is no longer the key's, because another process took the key over after
	// this one's lease lapsed. Nothing was written: the new owner's record
	// stands. fn may have had its effect (at least once, as for any
	// takeover).
	ErrFenced = idemcore.ErrFenced

	// ErrLeaseLost is the cause (context.Cause) of fn's context when its
	// claim's lease passed unrenewed or a renewal was refused, and of an
	// outbox handler's when its message's claim did: another process may
	// take the key (or the message) over, so fn should stop.
	ErrLeaseLost = idemcore.ErrLeaseLost

	// ErrDispatcherRunning is wrapped by the error of Dispatch while this
	// engine's dispatcher already runs (one per engine; run one engine per
	// process to drain the outbox from several).
	ErrDispatcherRunning = idemcore.ErrDispatcherRunning
)
