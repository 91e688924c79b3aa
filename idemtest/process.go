package idemtest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/internal/testkit"
)

// process holds the last row of DESIGN.md's table (the process is killed at
// any point: whatever last committed decides) and the ownership of a store
// by a live process, with child processes of the test binary killed with
// SIGKILL in the middle of fn.
func (s *suite[T]) process(t *testing.T) {
	// killed runs a child in role on a new store, kills it once it reports
	// line, and returns the store, its claims lapsed if the backend has any.
	killed := func(t *testing.T, role, line string, p idemcore.RecoveryPolicy) string {
		store := s.h.New(t)
		if s.h.Check != nil {
			t.Cleanup(func() { s.h.Check(t, store) })
		}
		c := s.startChild(t, role, store, p)
		c.Await(line)
		c.Kill()
		if s.h.OwnedAcrossProcesses {
			s.h.ExpireOwners(t, store)
		}
		return store
	}

	t.Run("process killed in Do's fn: re-executed with Recovered", func(t *testing.T) {
		store := killed(t, childDo, "in-fn", idemcore.RecoverReexecute)
		e := s.open(t, store, Options{})
		r := record(t, e, crashKey)
		require.NotNil(t, r, "the started record committed before fn ran")
		require.Equal(t, idemcore.StateStarted, r.State)
		require.Equal(t, 1, r.Attempt)
		res, err := e.Do(bg, crashKey, fp, func(ctx context.Context) ([]byte, error) {
			wantCall(t, ctx, idemcore.Call{Key: crashKey, Attempt: 2, Recovered: true})
			return []byte("reconciled"), nil
		})
		require.NoError(t, err)
		require.Equal(t, 2, res.Attempt)
		res, err = e.Do(bg, crashKey, fp, func(context.Context) ([]byte, error) { return nil, errMustNotRun })
		require.NoError(t, err)
		require.True(t, res.Replayed)
		require.Equal(t, "reconciled", string(res.Response))
	})

	t.Run("process killed in Do's fn under refuse: ErrIncomplete until resolved", func(t *testing.T) {
		store := killed(t, childDo, "in-fn", idemcore.RecoverRefuse)
		e := s.open(t, store, Options{Recovery: idemcore.RecoverRefuse})
		_, err := e.Do(bg, crashKey, fp, func(context.Context) ([]byte, error) { return nil, errMustNotRun })
		require.ErrorIs(t, err, idemcore.ErrIncomplete)
		require.Contains(t, err.Error(), "attempt 1")
		require.NoError(t, e.Resolve(crashKey, []byte("checked by hand"), nil))
		res, err := e.Do(bg, crashKey, fp, func(context.Context) ([]byte, error) { return nil, errMustNotRun })
		require.NoError(t, err)
		require.True(t, res.Replayed)
		require.Equal(t, "checked by hand", string(res.Response))
	})

	t.Run("process killed in DoTx's fn: nothing committed", func(t *testing.T) {
		store := killed(t, childDoTx, "in-fn", idemcore.RecoverReexecute)
		e := s.open(t, store, Options{})
		require.Nil(t, record(t, e, crashKey), "no started record in DoTx, no done record")
		require.Empty(t, s.effects(t, e), "fn's writes died with its transaction")
		require.Empty(t, messages(t, e), "its message too")
		res, err := e.DoTx(bg, crashKey, fp, func(ctx context.Context, tx T) ([]byte, error) {
			wantCall(t, ctx, idemcore.Call{Key: crashKey, Attempt: 1})
			return []byte("ok"), s.h.PutEffect(tx, crashKey, "y")
		})
		require.NoError(t, err)
		require.False(t, res.Replayed)
		require.Equal(t, map[string]string{crashKey: "y"}, s.effects(t, e))
	})

	t.Run("process killed in a handler: delivered again with the same downstream key", func(t *testing.T) {
		store := killed(t, childOutbox, "in-handler "+idemcore.DownstreamKey(crashKey, 0), idemcore.RecoverReexecute)
		var rec testkit.Recorder
		c := newClock()
		e := s.open(t, store, outboxOptions(c, map[string]idemcore.Handler{"charge": rec.Handler(nil)}, idemcore.OutboxOptions{}))
		testkit.Eventually(t, "the delivery after the restart", nil, func() bool { return len(rec.Delivered()) == 1 })
		m := rec.Delivered()[0]
		require.Equal(t, idemcore.DownstreamKey(crashKey, 0), m.DownstreamKey)
		require.Equal(t, []byte("1200"), m.Payload)
		require.Equal(t, 1, m.Attempt, "an attempt cut short by a crash is not counted")
		res, err := e.DoTx(bg, crashKey, fp, func(context.Context, T) ([]byte, error) { return nil, errMustNotRun })
		require.NoError(t, err)
		require.True(t, res.Replayed, "the call committed before the kill")
		require.Equal(t, "ord_1", string(res.Response))
	})

	t.Run("a store held by a live process", func(t *testing.T) {
		store := s.h.New(t)
		c := s.startChild(t, childDo, store, idemcore.RecoverReexecute)
		c.Await("in-fn")
		if !s.h.OwnedAcrossProcesses {
			// One process holds the store: a second Open fails, it does not
			// hang, and it takes nothing over.
			e, err := s.h.Open(t, store, Options{Now: newClock().Now})
			if err == nil {
				_ = e.Close()
			}
			require.Error(t, err, "a second process must not open a store another one holds")
			c.Kill()
			return
		}
		// Shared stores: the live owner's started record is never recovered;
		// a duplicate fails fast under InFlightFail, or waits.
		e := s.open(t, store, Options{InFlight: idemcore.InFlightFail})
		_, err := e.Do(bg, crashKey, fp, func(context.Context) ([]byte, error) { return nil, errMustNotRun })
		require.ErrorIs(t, err, idemcore.ErrInProgress)
		w := s.open(t, store, Options{})
		ctx, cancel := context.WithTimeout(bg, time.Second)
		defer cancel()
		_, err = w.Do(ctx, crashKey, fp, func(context.Context) ([]byte, error) { return nil, errMustNotRun })
		require.ErrorIs(t, err, context.DeadlineExceeded, "waits for the live owner")
		c.Kill()
	})
}
