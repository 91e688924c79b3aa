package idem_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit/boltkit"
)

// doer calls Do or DoTx with a fn that does not touch its Tx.
type doer struct {
	name string
	call func(e *idem.Engine, ctx context.Context, key string, fn func(context.Context) ([]byte, error)) (idem.Result, error)
}

var doers = []doer{
	{"Do", func(e *idem.Engine, ctx context.Context, key string, fn func(context.Context) ([]byte, error)) (idem.Result, error) {
		return e.Do(ctx, key, []byte("fp"), fn)
	}},
	{"DoTx", func(e *idem.Engine, ctx context.Context, key string, fn func(context.Context) ([]byte, error)) (idem.Result, error) {
		return e.DoTx(ctx, key, []byte("fp"), func(ctx context.Context, _ *idem.Tx) ([]byte, error) { return fn(ctx) })
	}},
}

// Only the end of fn's own context (the caller's ctx, or Close) is an
// interruption. A context error fn chose to return while its context is live
// (its own call to a gateway timed out) is an outcome: stored with its code,
// replayed.
func TestDownstreamTimeoutIsAnOutcome(t *testing.T) {
	for _, d := range doers {
		t.Run(d.name, func(t *testing.T) {
			e, _ := boltkit.Open(t, nil)
			runs := 0
			fn := func(ctx context.Context) ([]byte, error) {
				runs++
				downstream, cancel := context.WithTimeout(ctx, -1) // the gateway call timed out
				defer cancel()
				<-downstream.Done()
				return nil, idem.WithCode(downstream.Err(), "downstream_timeout")
			}
			_, err := d.call(e, bg, "k", fn)
			var ie *idem.Error
			require.ErrorAs(t, err, &ie)
			require.Equal(t, "downstream_timeout", ie.Code)
			require.ErrorIs(t, err, context.DeadlineExceeded, "the first answer wraps fn's error")
			r := record(t, e, "k")
			require.NotNil(t, r, "the outcome is stored")
			require.Equal(t, idem.StateDone, r.State)
			require.Equal(t, "downstream_timeout", r.Err.Code)

			res, err := d.call(e, bg, "k", fn)
			require.ErrorAs(t, err, &ie)
			require.Equal(t, "downstream_timeout", ie.Code, "replayed with its code")
			require.True(t, res.Replayed)
			require.Equal(t, 1, runs)
		})
	}
}

// When fn's own context ends while it runs, the error it returns is an
// interruption: Do keeps its started record (unknown outcome); DoTx committed
// nothing, so its key is free.
func TestEndOfFnsContextIsAnInterruption(t *testing.T) {
	ends := map[string]func(t *testing.T, e *idem.Engine, cancel context.CancelFunc){
		"caller's ctx cancelled": func(_ *testing.T, _ *idem.Engine, cancel context.CancelFunc) { cancel() },
		"Close": func(t *testing.T, e *idem.Engine, _ context.CancelFunc) {
			go func() {
				if err := e.Close(); err != nil {
					t.Error(err)
				}
			}()
		},
	}
	for endName, end := range ends {
		for _, d := range doers {
			t.Run(d.name+" "+endName, func(t *testing.T) {
				e, path := boltkit.Open(t, nil)
				ctx, cancel := context.WithCancel(bg)
				defer cancel()
				_, err := d.call(e, ctx, "k", func(ctx context.Context) ([]byte, error) {
					end(t, e, cancel)
					<-ctx.Done()
					return nil, idem.WithCode(ctx.Err(), "gave_up")
				})
				require.ErrorIs(t, err, context.Canceled)
				var ie *idem.Error
				require.False(t, errors.As(err, &ie), "not a stored outcome: %v", err)
				require.NoError(t, e.Close())

				e2, err := idem.Open(path, nil)
				require.NoError(t, err)
				defer e2.Close()
				r, err := e2.Get("k")
				if d.name == "Do" {
					require.NoError(t, err)
					require.Equal(t, idem.StateStarted, r.State, "unknown outcome: stays started")
				} else {
					require.ErrorIs(t, err, idem.ErrNotFound, "DoTx committed nothing: the key is free")
				}
				var got idem.Call
				_, err = d.call(e2, bg, "k", func(ctx context.Context) ([]byte, error) {
					got, _ = idem.CallFrom(ctx)
					return []byte("ok"), nil
				})
				require.NoError(t, err)
				require.Equal(t, d.name == "Do", got.Recovered)
			})
		}
	}
}

// A response is an outcome even when fn's context ended before fn returned
// it: recorded, oversized ones included (fail closed with ErrResponseTooLarge).
func TestResponseAfterFnsContextEndedIsAnOutcome(t *testing.T) {
	for _, d := range doers {
		for _, size := range []int{2, 64} {
			name := map[int]string{2: " fits", 64: " too large"}[size]
			t.Run(d.name+name, func(t *testing.T) {
				e, _ := boltkit.Open(t, &idem.Options{MaxResponseSize: 8})
				ctx, cancel := context.WithCancel(bg)
				defer cancel()
				_, err := d.call(e, ctx, "k", func(context.Context) ([]byte, error) {
					cancel()
					return make([]byte, size), nil
				})
				r := record(t, e, "k")
				require.NotNil(t, r, "recorded")
				require.Equal(t, idem.StateDone, r.State)
				if size > 8 {
					require.ErrorIs(t, err, idem.ErrResponseTooLarge)
					require.ErrorIs(t, r.Err, idem.ErrResponseTooLarge)
				} else {
					require.NoError(t, err)
					require.Len(t, r.Response, size)
				}
			})
		}
	}
}
