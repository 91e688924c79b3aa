package idemtest

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemcore"
)

// recovery holds contract 5 and 6 for interrupted executions (a started
// record no live call owns): the default policy re-executes with
// CallFrom(ctx).Recovered and the next attempt number, the refuse policy
// returns ErrIncomplete until an operator resolves or forgets the key, and
// nothing that frees a key erases the evidence of an unknown outcome.
func (s *suite[T]) recovery(t *testing.T) {
	t.Run("re-execute: Recovered and the next attempt", func(t *testing.T) {
		both(t, func(t *testing.T, v via) {
			e, store := s.fresh(t, Options{})
			s.interrupt(t, e, "k")
			res, err := call(bg, e, v, "k", fp, func(ctx context.Context, tx T) ([]byte, error) {
				wantCall(t, ctx, idemcore.Call{Key: "k", Attempt: 2, Recovered: true})
				return []byte("reconciled"), s.effect(v, tx, "order-1", "A1")
			})
			require.NoError(t, err)
			require.Equal(t, 2, res.Attempt)
			require.False(t, res.Replayed)
			r := record(t, e, "k")
			require.Equal(t, idemcore.StateDone, r.State)
			require.Equal(t, 2, r.Attempt)
			s.wantEffects(t, e, v, map[string]string{"order-1": "A1"}, "")

			e = s.reopen(t, e, store, Options{})
			res, err = call(bg, e, v, "k", fp, mustNotRun[T](t))
			require.NoError(t, err)
			require.True(t, res.Replayed)
			require.Equal(t, 2, res.Attempt, "the answer comes from attempt 2")
			require.Equal(t, "reconciled", string(res.Response))
		})
	})

	t.Run("refuse: ErrIncomplete until resolved", func(t *testing.T) {
		both(t, func(t *testing.T, v via) {
			opts := Options{Recovery: idemcore.RecoverRefuse}
			e, store := s.fresh(t, opts)
			s.interrupt(t, e, "k")
			for range 2 {
				_, err := call(bg, e, v, "k", fp, mustNotRun[T](t))
				require.ErrorIs(t, err, idemcore.ErrIncomplete)
				require.Contains(t, err.Error(), "attempt 1")
			}
			e = s.reopen(t, e, store, opts)
			_, err := call(bg, e, v, "k", fp, mustNotRun[T](t))
			require.ErrorIs(t, err, idemcore.ErrIncomplete, "also after a restart")
			r := record(t, e, "k")
			require.Equal(t, idemcore.StateStarted, r.State, "untouched")
			require.Equal(t, 1, r.Attempt)
		})
	})

	t.Run("Resolve", func(t *testing.T) {
		e, store := s.fresh(t, Options{Recovery: idemcore.RecoverRefuse})
		s.interrupt(t, e, "paid")
		s.interrupt(t, e, "declined")
		require.NoError(t, e.Resolve("paid", []byte("order-1"), nil))
		require.NoError(t, e.Resolve("declined", nil, &idemcore.Error{Code: "card_declined", Message: "the gateway declined"}))
		check := func(e Engine[T], when string) {
			res, err := call(bg, e, viaDo, "paid", fp, mustNotRun[T](t))
			require.NoError(t, err, when)
			require.True(t, res.Replayed, when)
			require.Equal(t, "order-1", string(res.Response), when)
			_, err = call(bg, e, viaDoTx, "declined", fp, mustNotRun[T](t))
			var ie *idemcore.Error
			require.ErrorAs(t, err, &ie, when)
			require.Equal(t, "card_declined", ie.Code, when)
			require.Equal(t, "the gateway declined", ie.Message, when)
		}
		check(e, "resolved")
		e = s.reopen(t, e, store, Options{Recovery: idemcore.RecoverRefuse})
		check(e, "after a restart")
		require.ErrorIs(t, e.Resolve("paid", []byte("again"), nil), idemcore.ErrState, "a done record is not resolved again")
		require.ErrorIs(t, e.Resolve("missing", nil, nil), idemcore.ErrNotFound)
		_, err := e.Do(bg, "paid", other, func(context.Context) ([]byte, error) { return nil, errMustNotRun })
		require.ErrorIs(t, err, idemcore.ErrFingerprintMismatch, "the resolved record keeps the fingerprint")
	})

	t.Run("Forget", func(t *testing.T) {
		e, _ := s.fresh(t, Options{Recovery: idemcore.RecoverRefuse})
		s.interrupt(t, e, "interrupted")
		_, err := e.Do(bg, "done", fp, func(context.Context) ([]byte, error) { return []byte("v1"), nil })
		require.NoError(t, err)
		for _, key := range []string{"interrupted", "done"} {
			require.NoError(t, e.Forget(key))
			require.Nil(t, record(t, e, key))
			res, err := e.Do(bg, key, other, func(ctx context.Context) ([]byte, error) {
				wantCall(t, ctx, idemcore.Call{Key: key, Attempt: 1}, "new, whatever it held")
				return []byte("v2"), nil
			})
			require.NoError(t, err, key)
			require.Equal(t, "v2", string(res.Response))
			require.False(t, res.Replayed)
		}
		require.ErrorIs(t, e.Forget("missing"), idemcore.ErrNotFound)
	})

	// DESIGN.md contract 6 and issue 8 item 1: a call that recovers an
	// interrupted execution and ends without an outcome leaves the key
	// recovering, and the attempt number never repeats. (A failed done
	// commit, the fourth column, needs a fault the suite cannot
	// cause through the contract.)
	endings := []struct {
		name string
		// end ends the recovering fn; cancel cancels the caller's ctx.
		end func(ctx context.Context, cancel context.CancelFunc) ([]byte, error)
	}{
		{"Retryable", func(context.Context, context.CancelFunc) ([]byte, error) {
			return nil, idemcore.Retryable(errors.New("gateway busy"))
		}},
		{"context error", func(ctx context.Context, cancel context.CancelFunc) ([]byte, error) {
			cancel() // the caller gives up while fn runs: an interruption
			<-ctx.Done()
			return nil, fmt.Errorf("gateway: %w", ctx.Err())
		}},
		{"panic", func(context.Context, context.CancelFunc) ([]byte, error) { panic("boom") }},
	}
	t.Run("a recovering call that ends without an outcome keeps the evidence", func(t *testing.T) {
		for _, v := range []via{viaDo, viaDoTx} {
			for _, end := range endings {
				name := v.String() + "/" + end.name
				t.Run(name, func(t *testing.T) {
					e, _ := s.fresh(t, Options{})
					s.interrupt(t, e, "k")
					ctx, cancel := context.WithCancel(bg)
					defer cancel()
					o := callRecovering(ctx, e, v, "k", fp, func(ctx context.Context, _ T) ([]byte, error) {
						wantCall(t, ctx, idemcore.Call{Key: "k", Attempt: 2, Recovered: true})
						return end.end(ctx, cancel)
					})
					require.True(t, o.err != nil || o.panicked != nil, "the recovering call has no outcome")
					r := record(t, e, "k")
					require.NotNil(t, r, "the interrupted record stays")
					require.Equal(t, idemcore.StateStarted, r.State)

					res, err := e.Do(bg, "k", fp, func(ctx context.Context) ([]byte, error) {
						c := callFrom(t, ctx)
						assert.True(t, c.Recovered, "still told it recovers")
						assert.Greater(t, c.Attempt, 2, "attempts 1 and 2 ran: the number never repeats")
						return []byte("ok"), nil
					})
					require.NoError(t, err)
					require.Greater(t, res.Attempt, 2)
				})
			}
		}
	})
}
