package idemtest

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemcore"
)

// OwnedElsewhere is the suite's test backend for the ownership rule: it
// wraps b and reports the started record of every key for which owned
// returns true as held by a live owner in another process. Owner answers
// Owned for it, and a Claim of the key answers ClaimOwned, the way a
// Postgres backend answers for an unexpired lease: a Claim that would take
// an interrupted execution over (ClaimRequest.Prev set), and a Claim of a
// key without a record (Prev nil), the way Postgres answers for a key whose
// started row another process's transaction holds, not yet committed and
// so invisible to Lookup (a backend that claims first, Info.ClaimFirst,
// answers a Claim with Prev nil by the record stored, if there is one,
// as it would). Everything else is b's. The engine must then wait for the record to change or refuse
// with an *idem.InProgressError, never recover it.
func OwnedElsewhere[T any](b idemcore.Backend[T], owned func(key string) bool) idemcore.Backend[T] {
	return &ownedBackend[T]{Backend: b, owned: owned}
}

type ownedBackend[T any] struct {
	idemcore.Backend[T]
	owned func(key string) bool
}

func (b *ownedBackend[T]) Owner(ctx context.Context, rec *idemcore.Record) (idemcore.Ownership, error) {
	if b.owned(rec.Key) {
		return idemcore.Ownership{Owned: true, Owner: "another process (idemtest)"}, nil
	}
	return b.Backend.Owner(ctx, rec)
}

func (b *ownedBackend[T]) Claim(ctx context.Context, req idemcore.ClaimRequest) (idemcore.ClaimResult, error) {
	if !b.owned(req.Started.Key) {
		return b.Backend.Claim(ctx, req)
	}
	if req.Prev == nil && b.Info().ClaimFirst {
		// A backend that claims first answers the record it finds
		// (Info.ClaimFirst): the owner's, for the engine to judge.
		rec, at, err := b.Backend.Lookup(ctx, idemcore.Lookup{Key: req.Started.Key, Now: req.Started.StartedAt, Retention: req.Started.Retention})
		if err != nil {
			return idemcore.ClaimResult{}, err
		}
		if rec != nil {
			return idemcore.ClaimResult{Status: idemcore.ClaimChanged, Current: rec, At: at}, nil
		}
	}
	return idemcore.ClaimResult{Status: idemcore.ClaimOwned, Ownership: idemcore.Ownership{Owned: true}}, nil
}

// owned holds the ownership rule as a backend operation (DESIGN.md's
// interrupted executions; issue 10 item 4): a started record that the
// backend reports as owned by a live process elsewhere is never recovered,
// under either recovery policy. A duplicate under InFlightFail gets an
// *idem.InProgressError; under InFlightWait it waits, and recovers the
// record only once its owner is gone; a waiter whose ctx ends returns
// ctx.Err() and changes nothing. Run through Harness.OpenWrapped and
// OwnedElsewhere.
func (s *suite[T]) owned(t *testing.T) {
	if s.h.OpenWrapped == nil {
		t.Skip("idemtest: Harness.OpenWrapped is not set: the ownership cases need it")
	}
	// setup leaves an interrupted execution of attempt 1 under key k and
	// reopens the store with k owned elsewhere while *elsewhere is true.
	setup := func(t *testing.T, opts Options) (Engine[T], *atomic.Bool) {
		e, store := s.fresh(t, Options{})
		s.interrupt(t, e, "k")
		require.NoError(t, e.Close())
		elsewhere := new(atomic.Bool)
		elsewhere.Store(true)
		e = s.openWith(t, store, opts, func(b idemcore.Backend[T]) idemcore.Backend[T] {
			return OwnedElsewhere(b, func(key string) bool { return key == "k" && elsewhere.Load() })
		})
		return e, elsewhere
	}
	untouched := func(t *testing.T, e Engine[T]) {
		t.Helper()
		r := record(t, e, "k")
		require.NotNil(t, r)
		require.Equal(t, idemcore.StateStarted, r.State, "the owner's record is untouched")
		require.Equal(t, 1, r.Attempt)
	}

	for _, policy := range []idemcore.RecoveryPolicy{idemcore.RecoverReexecute, idemcore.RecoverRefuse} {
		t.Run("InFlightFail, "+policyName(policy)+": InProgressError, never recovered", func(t *testing.T) {
			both(t, func(t *testing.T, v via) {
				e, _ := setup(t, Options{InFlight: idemcore.InFlightFail, Recovery: policy})
				for range 2 {
					_, err := call(bg, e, v, "k", fp, mustNotRun[T](t))
					var ip *idemcore.InProgressError
					require.ErrorAs(t, err, &ip)
					require.ErrorIs(t, err, idemcore.ErrInProgress)
					require.NotErrorIs(t, err, idemcore.ErrIncomplete, "owned is not interrupted")
				}
				untouched(t, e)
				_, err := call(bg, e, v, "k", other, mustNotRun[T](t))
				require.ErrorIs(t, err, idemcore.ErrFingerprintMismatch, "another fingerprint conflicts, owned or not")
			})
		})
	}

	t.Run("InFlightWait: a waiter whose ctx ends changes nothing", func(t *testing.T) {
		both(t, func(t *testing.T, v via) {
			e, _ := setup(t, Options{})
			ctx, cancel := context.WithCancel(bg)
			defer cancel()
			var waits atomic.Int32
			unset := s.h.Hook(PointWait, func() {
				if waits.Add(1) == 2 {
					cancel() // the waiter has polled the owner twice
				}
			})
			defer unset()
			_, err := call(ctx, e, v, "k", fp, mustNotRun[T](t))
			require.ErrorIs(t, err, context.Canceled)
			require.GreaterOrEqual(t, waits.Load(), int32(2), "it waited")
			untouched(t, e)
		})
	})

	t.Run("InFlightWait: recovered once the owner is gone", func(t *testing.T) {
		both(t, func(t *testing.T, v via) {
			e, elsewhere := setup(t, Options{})
			var waits atomic.Int32
			unset := s.h.Hook(PointWait, func() {
				if waits.Add(1) == 3 {
					elsewhere.Store(false) // the owner's process died
				}
			})
			defer unset()
			var ranWhileOwned atomic.Bool
			res, err := call(bg, e, v, "k", fp, func(ctx context.Context, tx T) ([]byte, error) {
				wantCall(t, ctx, idemcore.Call{Key: "k", Attempt: 2, Recovered: true})
				ranWhileOwned.Store(elsewhere.Load())
				return []byte("reconciled"), nil
			})
			require.NoError(t, err)
			require.False(t, ranWhileOwned.Load(), "fn runs only once the owner is gone")
			require.Equal(t, 2, res.Attempt)
			require.GreaterOrEqual(t, waits.Load(), int32(3), "it waited for the owner")
			r := record(t, e, "k")
			require.Equal(t, idemcore.StateDone, r.State)
			require.Equal(t, 2, r.Attempt)
		})
	})

	// A key without a visible record whose claim answers ClaimOwned (no
	// record to take over: Postgres's key held by another process's
	// uncommitted transaction) is owned elsewhere as well: Do fails fast or
	// waits, and runs fn as a first execution once the owner is gone.
	fresh := func(t *testing.T, opts Options) (Engine[T], *atomic.Bool) {
		e, store := s.fresh(t, Options{})
		require.NoError(t, e.Close())
		elsewhere := new(atomic.Bool)
		elsewhere.Store(true)
		e = s.openWith(t, store, opts, func(b idemcore.Backend[T]) idemcore.Backend[T] {
			return OwnedElsewhere(b, func(key string) bool { return key == "free" && elsewhere.Load() })
		})
		return e, elsewhere
	}
	t.Run("InFlightFail: a claim owned with no record to take over is an InProgressError", func(t *testing.T) {
		e, _ := fresh(t, Options{InFlight: idemcore.InFlightFail})
		_, err := e.Do(bg, "free", fp, func(context.Context) ([]byte, error) {
			t.Error("fn ran while the key was owned elsewhere")
			return nil, nil
		})
		var ip *idemcore.InProgressError
		require.ErrorAs(t, err, &ip)
		require.True(t, ip.StartedAt.IsZero(), "no record was seen: its start is unknown, not made up")
		require.Nil(t, record(t, e, "free"), "nothing stored")
	})
	t.Run("InFlightWait: a claim owned with no record to take over waits, then runs fn first", func(t *testing.T) {
		e, elsewhere := fresh(t, Options{})
		var waits atomic.Int32
		unset := s.h.Hook(PointWait, func() {
			if waits.Add(1) == 2 {
				elsewhere.Store(false) // the owner's transaction rolled back
			}
		})
		defer unset()
		res, err := e.Do(bg, "free", fp, func(ctx context.Context) ([]byte, error) {
			wantCall(t, ctx, idemcore.Call{Key: "free", Attempt: 1})
			return []byte("first"), nil
		})
		require.NoError(t, err)
		require.Equal(t, "first", string(res.Response))
		require.Equal(t, 1, res.Attempt)
		require.GreaterOrEqual(t, waits.Load(), int32(2), "it waited for the owner")
	})

	t.Run("InFlightWait: duplicates in this process wait behind the waiting leader", func(t *testing.T) {
		e, elsewhere := setup(t, Options{})
		var waits atomic.Int32
		gate := make(chan struct{})
		var once sync.Once
		unset := s.h.Hook(PointWait, func() {
			if waits.Add(1) >= 4 {
				once.Do(func() { close(gate) })
			}
		})
		defer unset()
		var runs, ranWhileOwned atomic.Int32
		errs := make(chan error, 3)
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(func() {
				_, err := e.Do(bg, "k", fp, func(context.Context) ([]byte, error) {
					runs.Add(1)
					if elsewhere.Load() {
						ranWhileOwned.Add(1)
					}
					return []byte("once"), nil
				})
				errs <- err
			})
		}
		// An engine that does not wait ends every call without reaching
		// the gate.
		go func() { wg.Wait(); once.Do(func() { close(gate) }) }()
		<-gate
		elsewhere.Store(false)
		for range 3 {
			require.NoError(t, <-errs)
		}
		require.Zero(t, ranWhileOwned.Load(), "never recovered while owned")
		require.Equal(t, int32(1), runs.Load(), "recovered once, for every duplicate")
		r := record(t, e, "k")
		require.Equal(t, idemcore.StateDone, r.State)
		require.Equal(t, 2, r.Attempt)
	})
}
