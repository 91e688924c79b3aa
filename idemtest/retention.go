package idemtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemcore"
)

// retention holds contract 7 through the clock seam (Options.Now): a record
// expires a window after it completes (an orphaned started record, after it
// started; never under the refuse policy); an expired record is absent to
// every reader at once; pruning never reclaims a live record.
func (s *suite[T]) retention(t *testing.T) {
	t.Run("replayed inside the window, absent at its end", func(t *testing.T) {
		for _, window := range []time.Duration{0, time.Hour} {
			t.Run(fmt.Sprint(window), func(t *testing.T) {
				c := newClock()
				e, _ := s.fresh(t, Options{Retention: window, Now: c.Now})
				if window == 0 {
					window = idemcore.DefaultRetention
				}
				require.Equal(t, window, e.Retention())
				_, err := e.Do(bg, "k", fp, func(context.Context) ([]byte, error) { return []byte("first"), nil })
				require.NoError(t, err)

				c.Advance(window - time.Nanosecond)
				res, err := call(bg, e, viaDo, "k", fp, mustNotRun[T](t))
				require.NoError(t, err)
				require.True(t, res.Replayed, "inside the window")

				c.Advance(time.Nanosecond)
				_, err = e.Get("k")
				require.ErrorIs(t, err, idemcore.ErrNotFound, "expired at the window's end, before any prune")
				require.Empty(t, records(t, e))
				require.ErrorIs(t, e.Forget("k"), idemcore.ErrNotFound, "an expired record is absent to Forget too, before any prune")
				res, err = e.Do(bg, "k", other, func(ctx context.Context) ([]byte, error) {
					wantCall(t, ctx, idemcore.Call{Key: "k", Attempt: 1})
					return []byte("second"), nil
				})
				require.NoError(t, err, "the key is new: any fingerprint")
				require.False(t, res.Replayed)
				require.Equal(t, "second", string(res.Response))
			})
		}
	})

	t.Run("an expired key is new to Do and DoTx alike, its record not pruned yet", func(t *testing.T) {
		for _, v := range []via{viaDo, viaDoTx} {
			t.Run(v.String(), func(t *testing.T) {
				c := newClock()
				e, _ := s.fresh(t, Options{Retention: time.Hour, Now: c.Now})
				_, err := call(bg, e, v, "k", fp, ok[T]("first"))
				require.NoError(t, err)
				first := record(t, e, "k")
				c.Advance(time.Hour)
				res, err := call(bg, e, v, "k", other, func(ctx context.Context, _ T) ([]byte, error) {
					wantCall(t, ctx, idemcore.Call{Key: "k", Attempt: 1}, "the expired record is no evidence")
					return []byte("second"), nil
				})
				require.NoError(t, err, "the key is new: any fingerprint")
				require.False(t, res.Replayed)
				r := record(t, e, "k")
				require.NotNil(t, r)
				require.Equal(t, "second", string(r.Response))
				require.Equal(t, 1, r.Attempt)
				require.NotEqual(t, first.Fingerprint, r.Fingerprint, "the new record carries the new fingerprint")
				require.Equal(t, c.Now(), r.StartedAt.UTC(), "the new record's own times")
				res, err = call(bg, e, v, "k", other, mustNotRun[T](t))
				require.NoError(t, err, "the new record carries the new fingerprint")
				require.True(t, res.Replayed)
				require.Equal(t, "second", string(res.Response))
				_, err = call(bg, e, v, "k", fp, mustNotRun[T](t))
				require.ErrorIs(t, err, idemcore.ErrFingerprintMismatch, "the old fingerprint went with the old record")
			})
		}
	})

	t.Run("the window runs from completion", func(t *testing.T) {
		c := newClock()
		e, _ := s.fresh(t, Options{Retention: time.Hour, Now: c.Now})
		_, err := e.Do(bg, "k", fp, func(context.Context) ([]byte, error) {
			c.Advance(30 * time.Minute) // a slow fn
			return []byte("v"), nil
		})
		require.NoError(t, err)
		r := record(t, e, "k")
		require.Equal(t, start, r.StartedAt.UTC())
		require.Equal(t, start.Add(30*time.Minute), r.CompletedAt.UTC())
		c.Advance(time.Hour - time.Nanosecond)
		require.NotNil(t, record(t, e, "k"), "an hour after it started, not after it completed")
		c.Advance(time.Nanosecond)
		require.Nil(t, record(t, e, "k"))
	})

	t.Run("an orphaned started record expires a window after it started", func(t *testing.T) {
		c := newClock()
		e, _ := s.fresh(t, Options{Retention: time.Hour, Now: c.Now})
		s.interrupt(t, e, "k")
		c.Advance(time.Hour - time.Nanosecond)
		require.NotNil(t, record(t, e, "k"))
		c.Advance(time.Nanosecond)
		require.Nil(t, record(t, e, "k"))
		res, err := e.Do(bg, "k", fp, func(ctx context.Context) ([]byte, error) {
			wantCall(t, ctx, idemcore.Call{Key: "k", Attempt: 1}, "the evidence expired with its window")
			return []byte("v"), nil
		})
		require.NoError(t, err)
		require.Equal(t, 1, res.Attempt)
	})

	t.Run("under the refuse policy an interrupted execution stays until resolved", func(t *testing.T) {
		c := newClock()
		opts := Options{Retention: time.Hour, Recovery: idemcore.RecoverRefuse, Now: c.Now}
		e, _ := s.fresh(t, opts)
		s.interrupt(t, e, "k")
		c.Advance(100 * time.Hour)
		_, err := e.Prune(bg)
		require.NoError(t, err)
		_, err = e.Do(bg, "k", fp, func(context.Context) ([]byte, error) { return nil, errMustNotRun })
		require.ErrorIs(t, err, idemcore.ErrIncomplete)
		require.Equal(t, idemcore.StateStarted, record(t, e, "k").State)
		require.NoError(t, e.Resolve("k", []byte("resolved"), nil))
		res, err := e.Do(bg, "k", fp, func(context.Context) ([]byte, error) { return nil, errMustNotRun })
		require.NoError(t, err)
		require.Equal(t, "resolved", string(res.Response))
	})

	t.Run("prune never reclaims a live record", func(t *testing.T) {
		c := newClock()
		e, _ := s.fresh(t, Options{Retention: time.Hour, Now: c.Now})
		// One record every 5 minutes for 3 hours; prune at every step.
		pruned := 0
		const step, n = 5 * time.Minute, 36
		for i := range n {
			_, err := e.Do(bg, fmt.Sprintf("k%02d", i), fp, func(context.Context) ([]byte, error) { return nil, nil })
			require.NoError(t, err)
			p, err := e.Prune(bg)
			require.NoError(t, err)
			pruned += p
			for j := max(0, i-11); j <= i; j++ { // the last hour's records
				require.NotNil(t, record(t, e, fmt.Sprintf("k%02d", j)), "record %d pruned at step %d", j, i)
			}
			c.Advance(step)
		}
		require.Len(t, records(t, e), 11, "the last hour, as the clock ended a step after the last call")
		c.Advance(2 * time.Hour)
		p, err := e.Prune(bg)
		require.NoError(t, err)
		require.Equal(t, n, pruned+p, "every record is reclaimed in the end")
		require.Empty(t, records(t, e))
	})

	t.Run("a record lives the window it was written under", func(t *testing.T) {
		c := newClock()
		e, store := s.fresh(t, Options{Retention: 7 * 24 * time.Hour, Now: c.Now})
		_, err := e.Do(bg, "k", fp, func(context.Context) ([]byte, error) { return []byte("v"), nil })
		require.NoError(t, err)
		e = s.reopen(t, e, store, Options{Retention: time.Hour, Now: c.Now})
		c.Advance(48 * time.Hour)
		_, err = e.Prune(bg)
		require.NoError(t, err)
		res, err := e.Do(bg, "k", fp, func(context.Context) ([]byte, error) { return nil, errMustNotRun })
		require.NoError(t, err, "written under a 7-day window: live after 2 days, whatever the window now")
		require.True(t, res.Replayed)
	})

	t.Run("a recovering attempt interrupted in turn keeps the window it recovered", func(t *testing.T) {
		c := newClock()
		e, store := s.fresh(t, Options{Retention: 7 * 24 * time.Hour, Now: c.Now})
		s.interrupt(t, e, "k")
		e = s.reopen(t, e, store, Options{Retention: time.Hour, Now: c.Now})
		if s.h.OwnedAcrossProcesses {
			s.h.ExpireOwners(t, store)
		}
		o := callRecovering(bg, e, viaDo, "k", fp, func(ctx context.Context, _ T) ([]byte, error) {
			wantCall(t, ctx, idemcore.Call{Key: "k", Attempt: 2, Recovered: true})
			panic("interrupted again")
		})
		require.Equal(t, "interrupted again", o.panicked)
		c.Advance(48 * time.Hour)
		_, err := e.Prune(bg)
		require.NoError(t, err)
		res, err := e.Do(bg, "k", fp, func(ctx context.Context) ([]byte, error) {
			wantCall(t, ctx, idemcore.Call{Key: "k", Attempt: 3, Recovered: true}, "the evidence keeps its 7-day window")
			return []byte("v"), nil
		})
		require.NoError(t, err)
		require.Equal(t, 3, res.Attempt)
	})

	t.Run("an interrupted execution written under refuse is kept whatever a later Open says", func(t *testing.T) {
		c := newClock()
		e, store := s.fresh(t, Options{Retention: time.Hour, Recovery: idemcore.RecoverRefuse, Now: c.Now})
		s.interrupt(t, e, "k")
		e = s.reopen(t, e, store, Options{Retention: time.Hour, Now: c.Now})
		c.Advance(100 * time.Hour)
		_, err := e.Prune(bg)
		require.NoError(t, err)
		r := record(t, e, "k")
		require.NotNil(t, r, "kept until resolved")
		require.Equal(t, idemcore.StateStarted, r.State)
	})
}
