package idemtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemcore"
)

// dotx holds what DoTx promises beyond the outcome rows: fn's writes and the
// done record commit together, once, and group commit never mixes one call's
// failure into another's effects.
func (s *suite[T]) dotx(t *testing.T) {
	t.Run("effects commit together with the record", func(t *testing.T) {
		e, store := s.fresh(t, Options{})
		runs := 0
		fn := func(ctx context.Context, tx T) ([]byte, error) {
			runs++
			wantCall(t, ctx, idemcore.Call{Key: "create-1", Attempt: 1})
			if err := s.h.PutEffect(tx, "order-1", "A1"); err != nil {
				return nil, err
			}
			return []byte("order-1"), s.h.PutEffect(tx, "stock-A1", "9")
		}
		first, err := e.DoTx(bg, "create-1", fp, fn)
		require.NoError(t, err)
		require.Equal(t, "order-1", string(first.Response))
		require.False(t, first.Replayed)
		again, err := e.DoTx(bg, "create-1", fp, fn)
		require.NoError(t, err)
		require.True(t, again.Replayed)
		require.Equal(t, "order-1", string(again.Response))
		require.Equal(t, 1, runs, "a replay does not run fn")

		e = s.reopen(t, e, store, Options{})
		require.Equal(t, map[string]string{"order-1": "A1", "stock-A1": "9"}, s.effects(t, e), "both writes, once, after a restart")
		require.Equal(t, idemcore.StateDone, record(t, e, "create-1").State)
		res, err := e.DoTx(bg, "create-1", fp, func(context.Context, T) ([]byte, error) { return nil, errMustNotRun })
		require.NoError(t, err)
		require.True(t, res.Replayed)
	})

	t.Run("engine calls from inside fn are refused", func(t *testing.T) {
		e, _ := s.fresh(t, Options{})
		_, err := e.Do(bg, "done-before", fp, func(context.Context) ([]byte, error) { return []byte("x"), nil })
		require.NoError(t, err)
		var inner [3]error
		_, err = e.DoTx(bg, "k", fp, func(ctx context.Context, tx T) ([]byte, error) {
			// With fn's context, and with a fresh one: both would wait for
			// the writer fn holds.
			_, inner[0] = e.Do(ctx, "other", fp, func(context.Context) ([]byte, error) { return nil, nil })
			_, inner[1] = e.Do(context.Background(), "other", fp, func(context.Context) ([]byte, error) { return nil, nil })
			_, inner[2] = e.DoTx(ctx, "other", fp, func(context.Context, T) ([]byte, error) { return nil, nil })
			return []byte("ok"), nil
		})
		require.NoError(t, err)
		for i, err := range inner {
			require.ErrorIs(t, err, idemcore.ErrReentrant, "inner call %d", i)
		}
		require.Nil(t, record(t, e, "other"), "the refused calls stored nothing")
	})

	// 200 concurrent calls, 20 of which fail permanently, share commits:
	// each success's effect commits once, no failure's does.
	concurrentFailures := func(t *testing.T) map[string]int {
		e, _ := s.fresh(t, Options{})
		var mu sync.Mutex
		runs := map[string]int{}
		var wg sync.WaitGroup
		errs := make([]error, 200)
		for i := range 200 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				key := fmt.Sprintf("k%03d", i)
				_, errs[i] = e.DoTx(bg, key, fp, func(ctx context.Context, tx T) ([]byte, error) {
					mu.Lock()
					runs[key]++
					mu.Unlock()
					if err := s.h.PutEffect(tx, key, "v"); err != nil {
						return nil, err
					}
					if i%10 == 0 {
						return nil, idemcore.WithCode(errors.New("refused"), "refused")
					}
					return []byte(key), nil
				})
			}()
		}
		wg.Wait()
		want := map[string]string{}
		for i, err := range errs {
			key := fmt.Sprintf("k%03d", i)
			r := record(t, e, key)
			require.NotNil(t, r, key)
			require.Equal(t, idemcore.StateDone, r.State, key)
			if i%10 == 0 {
				var ie *idemcore.Error
				require.ErrorAs(t, err, &ie, key)
				require.Equal(t, "refused", ie.Code, key)
				require.Equal(t, "refused", r.Err.Code, key)
				continue
			}
			require.NoError(t, err, key)
			require.Equal(t, key, string(r.Response))
			want[key] = "v"
		}
		require.Equal(t, want, s.effects(t, e))
		return runs
	}
	t.Run("200 concurrent calls with 20 failing: each effect once", func(t *testing.T) {
		concurrentFailures(t)
	})
	t.Run("no fn runs more than 3 times per call", func(t *testing.T) {
		for key, n := range concurrentFailures(t) {
			require.LessOrEqual(t, n, 3, "fn of %s ran %d times", key, n)
		}
	})
	t.Run("no fn runs more than 3 times when each re-run exposes a new failure", func(t *testing.T) {
		// An adversary: fn i fails on its run 1 + i%5, so the re-runs that
		// one failure causes bring the next failures to light.
		e, _ := s.fresh(t, Options{})
		var mu sync.Mutex
		runs := map[string]int{}
		var wg sync.WaitGroup
		for i := range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				key := fmt.Sprintf("k%02d", i)
				_, _ = e.DoTx(bg, key, fp, func(ctx context.Context, tx T) ([]byte, error) {
					mu.Lock()
					runs[key]++
					n := runs[key]
					mu.Unlock()
					if n == 1+i%5 {
						return nil, errors.New("refused")
					}
					return []byte(key), s.h.PutEffect(tx, key, "v")
				})
			}()
		}
		wg.Wait()
		effects := s.effects(t, e)
		for key, n := range runs {
			require.LessOrEqual(t, n, 3, "fn of %s ran %d times", key, n)
			r := record(t, e, key)
			require.NotNil(t, r, key)
			if r.Err == nil {
				require.Equal(t, "v", effects[key], "%s: done without an error, so its effect committed", key)
			} else {
				require.NotContains(t, effects, key, "%s: failed, so its effect did not commit", key)
			}
		}
	})
}
