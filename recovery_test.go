package idem_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/fault"
	"github.com/idemkit/idem/internal/testkit"
	"github.com/idemkit/idem/internal/testkit/boltkit"
)

// What frees a key never erases the evidence of an earlier unknown outcome:
// however a call that recovers an interrupted execution ends without an
// outcome, the next call is still told it recovers, and attempt numbers never
// repeat (the kept record carries the attempt of the call that recovered).
func TestRecoveryIsNeverForgotten(t *testing.T) {
	if !testkit.Failpoints(t) {
		return // ran in a build with failpoints
	}
	errBusy := errors.New("gateway busy")
	ends := []struct {
		name string
		// fn is the recovering call's fn; cancel ends the recovering
		// caller's ctx.
		fn func(ctx context.Context, cancel context.CancelFunc) ([]byte, error)
		// arm sets the failpoints of the end, if any, for op.
		arm func(op string) (unset func())
	}{
		{name: "Retryable", fn: func(context.Context, context.CancelFunc) ([]byte, error) {
			return nil, idem.Retryable(errBusy)
		}},
		{name: "context error", fn: func(ctx context.Context, cancel context.CancelFunc) ([]byte, error) {
			cancel() // fn's own context ends: the caller gives up
			return nil, ctx.Err()
		}},
		{name: "panic", fn: func(context.Context, context.CancelFunc) ([]byte, error) {
			panic("boom")
		}},
		{name: "failed done commit", fn: func(context.Context, context.CancelFunc) ([]byte, error) {
			return []byte("charged"), nil
		}, arm: func(op string) func() {
			point := map[string]string{"Do": "do-done-commit", "DoTx": "dotx-before-commit"}[op]
			// A panic inside a commit function rolls its transaction back
			// and fails the commit, as a write error does.
			return fault.Set(point, func() error { panic("disk failed") })
		}},
	}
	for _, d := range doers {
		for _, end := range ends {
			t.Run(d.name+" "+end.name, func(t *testing.T) {
				e, _ := boltkit.Open(t, nil)
				_, err := interrupt(e, "k", []byte("fp")) // attempt 1: effect unknown
				require.ErrorIs(t, err, context.Canceled)

				ctx, cancel := context.WithCancel(bg)
				defer cancel()
				var recovering idem.Call
				func() {
					if end.arm != nil {
						defer end.arm(d.name)()
					}
					defer func() { _ = recover() }()
					_, err = d.call(e, ctx, "k", func(ctx context.Context) ([]byte, error) {
						recovering, _ = idem.CallFrom(ctx)
						return end.fn(ctx, cancel)
					})
					require.Error(t, err)
				}()
				require.Equal(t, idem.Call{Key: "k", Attempt: 2, Recovered: true}, recovering)

				r := record(t, e, "k")
				require.NotNil(t, r, "the evidence of attempt 1 is kept")
				require.Equal(t, idem.StateStarted, r.State)
				require.Equal(t, 2, r.Attempt, "the kept record carries the recovering call's attempt")

				for _, next := range doers {
					var got idem.Call
					res, err := next.call(e, bg, "k", func(ctx context.Context) ([]byte, error) {
						got, _ = idem.CallFrom(ctx)
						return nil, idem.Retryable(errBusy)
					})
					require.ErrorIs(t, err, idem.ErrRetryable)
					require.True(t, got.Recovered, "%s after it: still told it recovers", next.name)
					require.Greater(t, got.Attempt, recovering.Attempt, "attempt numbers never repeat")
					require.Equal(t, got.Attempt, res.Attempt)
					recovering = got
				}
				res, err := e.Do(bg, "k", []byte("fp"), okFn("reconciled"))
				require.NoError(t, err)
				require.Equal(t, 5, res.Attempt)
				res, err = e.Do(bg, "k", []byte("fp"), mustNotRun(t))
				require.NoError(t, err)
				require.True(t, res.Replayed)
				require.Equal(t, "reconciled", string(res.Response))
			})
		}
	}
}
