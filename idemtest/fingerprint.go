package idemtest

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemcore"
)

// other is a fingerprint that differs from fp: another request.
var other = []byte(`{"sku":"A1","qty":3}`)

// fingerprint holds contract 2: the same key with a different fingerprint
// fails with ErrFingerprintMismatch whatever state the record is in, even
// while the first call runs, and the record is untouched. The fast path
// (a done record answered without the per-key lock) never skips the check.
func (s *suite[T]) fingerprint(t *testing.T) {
	mismatch := func(t *testing.T, e Engine[T], v via, key, why string) {
		t.Helper()
		_, err := call(bg, e, v, key, other, mustNotRun[T](t))
		require.ErrorIs(t, err, idemcore.ErrFingerprintMismatch, why)
	}

	t.Run("done record: fast path, and cold after a restart", func(t *testing.T) {
		both(t, func(t *testing.T, v via) {
			e, store := s.fresh(t, Options{})
			_, err := call(bg, e, v, "k", fp, ok[T]("order-1"))
			require.NoError(t, err)
			_, err = call(bg, e, v, "e", fp, func(context.Context, T) ([]byte, error) {
				return nil, idemcore.WithCode(errors.New("declined"), "card_declined")
			})
			require.Error(t, err)
			for range 2 {
				mismatch(t, e, v, "k", "a done record")
				mismatch(t, e, v, "e", "a done record with an error")
			}
			e = s.reopen(t, e, store, Options{})
			mismatch(t, e, v, "k", "a done record read from the store")
			mismatch(t, e, v, "e", "an error record read from the store")
			res, err := call(bg, e, v, "k", fp, mustNotRun[T](t))
			require.NoError(t, err)
			require.True(t, res.Replayed)
			require.Equal(t, "order-1", string(res.Response), "the record is untouched")
			require.Equal(t, "order-1", string(record(t, e, "k").Response))
		})
	})

	t.Run("while the first call runs", func(t *testing.T) {
		both(t, func(t *testing.T, v via) {
			e, _ := s.fresh(t, Options{})
			release, leader, _ := s.leaderWithWaiters(t, e, v, "k", 0, ok[T]("order-1"), nil)
			mismatch(t, e, v, "k", "refused at once, not after waiting")
			close(release)
			l := <-leader
			require.NoError(t, l.err, "the running call is untouched")
			require.Equal(t, "order-1", string(l.res.Response))
			mismatch(t, e, v, "k", "and after")
		})
	})

	t.Run("started record of an interrupted execution", func(t *testing.T) {
		for _, p := range []idemcore.RecoveryPolicy{idemcore.RecoverReexecute, idemcore.RecoverRefuse} {
			t.Run(policyName(p), func(t *testing.T) {
				both(t, func(t *testing.T, v via) {
					e, store := s.fresh(t, Options{Recovery: p})
					s.interrupt(t, e, "k")
					mismatch(t, e, v, "k", "an interrupted execution")
					e = s.reopen(t, e, store, Options{Recovery: p})
					mismatch(t, e, v, "k", "an interrupted execution after a restart")
					r := record(t, e, "k")
					require.Equal(t, idemcore.StateStarted, r.State, "untouched: not recovered by the conflicting call")
					require.Equal(t, 1, r.Attempt)
				})
			})
		}
	})

	t.Run("nil and empty fingerprints are the same request", func(t *testing.T) {
		both(t, func(t *testing.T, v via) {
			e, _ := s.fresh(t, Options{})
			_, err := call(bg, e, v, "k", nil, ok[T]("v"))
			require.NoError(t, err)
			res, err := call(bg, e, v, "k", []byte{}, mustNotRun[T](t))
			require.NoError(t, err)
			require.True(t, res.Replayed)
		})
	})
}

// interrupt leaves an interrupted execution (attempt 1) on key: its fn
// panics, so the started record stays.
func (s *suite[T]) interrupt(t testing.TB, e Engine[T], key string) {
	t.Helper()
	o := callRecovering(bg, e, viaDo, key, fp, func(context.Context, T) ([]byte, error) { panic("interrupted") })
	require.Equal(t, "interrupted", o.panicked)
	r := record(t, e, key)
	require.NotNil(t, r)
	require.Equal(t, idemcore.StateStarted, r.State)
}

func policyName(p idemcore.RecoveryPolicy) string {
	if p == idemcore.RecoverRefuse {
		return "refuse"
	}
	return "re-execute"
}
