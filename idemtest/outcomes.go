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

// errDeclined is a user's sentinel that fn's permanent error wraps.
var errDeclined = errors.New("card declined")

// both runs f as a subtest for Do and for DoTx.
func both(t *testing.T, f func(t *testing.T, v via)) {
	for _, v := range []via{viaDo, viaDoTx} {
		t.Run(v.String(), func(t *testing.T) { f(t, v) })
	}
}

// effect writes the effect row (k, val) in tx under DoTx; under Do there is
// no transaction and it does nothing.
func (s *suite[T]) effect(v via, tx T, k, val string) error {
	if v == viaDoTx {
		return s.h.PutEffect(tx, k, val)
	}
	return nil
}

// wantEffects checks e's committed effect rows under DoTx (under Do there
// are none to check).
func (s *suite[T]) wantEffects(t testing.TB, e Engine[T], v via, want map[string]string, msg string) {
	t.Helper()
	if v == viaDoTx {
		require.Equal(t, want, s.effects(t, e), msg)
	}
}

// outcomes holds each row of DESIGN.md's "Outcomes, case by case" as a
// subtest named after the row. The last row (the process is killed) is in
// process.
func (s *suite[T]) outcomes(t *testing.T) {
	t.Run("fn returns (resp, nil)", func(t *testing.T) {
		both(t, func(t *testing.T, v via) {
			e, _ := s.fresh(t, Options{})
			release, leader, waiters := s.leaderWithWaiters(t, e, v, "k", 3, func(ctx context.Context, tx T) ([]byte, error) {
				return []byte("order-1"), s.effect(v, tx, "order-1", "A1")
			}, nil)
			close(release)
			l := <-leader
			require.NoError(t, l.err)
			require.Equal(t, "order-1", string(l.res.Response))
			require.False(t, l.res.Replayed)
			require.Equal(t, 1, l.res.Attempt)
			require.False(t, l.res.StartedAt.IsZero() || l.res.CompletedAt.IsZero(), "the record's times")
			for range 3 {
				w := <-waiters
				require.NoError(t, w.err)
				require.Equal(t, "order-1", string(w.res.Response), "waiters get the same resp")
				require.True(t, w.res.Replayed, "fn did not run in a waiter's call")
			}
			r := record(t, e, "k")
			require.Equal(t, idemcore.StateDone, r.State)
			require.Equal(t, "order-1", string(r.Response))
			require.Nil(t, r.Err)
			s.wantEffects(t, e, v, map[string]string{"order-1": "A1"}, "the effect committed with the record")
		})
	})

	t.Run("fn returns a permanent error", func(t *testing.T) {
		both(t, func(t *testing.T, v via) {
			e, store := s.fresh(t, Options{})
			release, leader, waiters := s.leaderWithWaiters(t, e, v, "k", 2, func(ctx context.Context, tx T) ([]byte, error) {
				if err := s.effect(v, tx, "order-1", "A1"); err != nil {
					return nil, err
				}
				return nil, idemcore.WithCode(fmt.Errorf("charge: %w", errDeclined), "card_declined")
			}, nil)
			close(release)
			l := <-leader
			var ie *idemcore.Error
			require.ErrorAs(t, l.err, &ie)
			require.Equal(t, "card_declined", ie.Code)
			require.Equal(t, "charge: card declined", ie.Message)
			require.ErrorIs(t, l.err, errDeclined, "the first call wraps fn's error")
			require.False(t, ie.Replayed)
			require.Equal(t, 1, l.res.Attempt, "Result comes beside the error")
			for range 2 {
				w := <-waiters
				var we *idemcore.Error
				require.ErrorAs(t, w.err, &we)
				require.Equal(t, ie.Code, we.Code)
				require.Equal(t, ie.Message, we.Message)
				require.True(t, w.res.Replayed)
			}
			r := record(t, e, "k")
			require.Equal(t, idemcore.StateDone, r.State)
			require.Equal(t, "card_declined", r.Err.Code)
			require.Equal(t, "charge: card declined", r.Err.Message)
			s.wantEffects(t, e, v, map[string]string{}, "fn's writes roll back with its error")

			replayed := func(e Engine[T], when string) {
				res, err := call(bg, e, v, "k", fp, mustNotRun[T](t))
				var re *idemcore.Error
				require.ErrorAs(t, err, &re, when)
				require.Equal(t, "card_declined", re.Code, when)
				require.Equal(t, "charge: card declined", re.Message, when)
				require.True(t, re.Replayed && res.Replayed, when)
			}
			replayed(e, "replay")
			replayed(s.reopen(t, e, store, Options{}), "replay after a restart")
		})
	})

	t.Run("fn's error of any bytes is stored and replayed exactly", func(t *testing.T) {
		both(t, func(t *testing.T, v via) {
			e, store := s.fresh(t, Options{})
			cases := map[string]struct{ code, msg string }{
				"nul-msg":      {"c", "parse failed near \"\x00\x01\""},
				"invalid-msg":  {"c", "parse failed near \"\xff\xfe\""},
				"nul-code":     {"c\x00", "x"},
				"invalid-code": {"c\xff", "x"},
			}
			for key, c := range cases {
				runs := 0
				fn := func(context.Context, T) ([]byte, error) {
					runs++
					return nil, idemcore.WithCode(errors.New(c.msg), c.code)
				}
				for range 2 {
					_, err := call(bg, e, v, key, fp, fn)
					var ie *idemcore.Error
					require.ErrorAs(t, err, &ie, key)
					require.True(t, ie.Code == c.code && ie.Message == c.msg, "%s: got %q %q", key, ie.Code, ie.Message)
				}
				require.Equal(t, 1, runs, "%s: fn runs once, its error stored", key)
			}
			e = s.reopen(t, e, store, Options{})
			for key, c := range cases {
				_, err := call(bg, e, v, key, fp, mustNotRun[T](t))
				var ie *idemcore.Error
				require.ErrorAs(t, err, &ie, key)
				require.True(t, ie.Replayed && ie.Code == c.code && ie.Message == c.msg, "%s after a restart: got %q %q", key, ie.Code, ie.Message)
			}
		})
	})

	t.Run("fn returns both resp and error", func(t *testing.T) {
		both(t, func(t *testing.T, v via) {
			e, store := s.fresh(t, Options{})
			release, leader, waiters := s.leaderWithWaiters(t, e, v, "k", 1, func(context.Context, T) ([]byte, error) {
				return []byte("partial"), errors.New("half done")
			}, nil)
			close(release)
			for _, o := range []outcome{<-leader, <-waiters} {
				require.Equal(t, "partial", string(o.res.Response))
				require.EqualError(t, o.err, "half done")
			}
			e = s.reopen(t, e, store, Options{})
			res, err := call(bg, e, v, "k", fp, mustNotRun[T](t))
			require.True(t, res.Replayed)
			require.Equal(t, "partial", string(res.Response), "both stored")
			require.EqualError(t, err, "half done")
		})
	})

	t.Run("fn returns Retryable(err)", func(t *testing.T) {
		both(t, func(t *testing.T, v via) {
			e, _ := s.fresh(t, Options{})
			errBusy := errors.New("gateway busy")
			release, leader, waiters := s.leaderWithWaiters(t, e, v, "k", 2, func(ctx context.Context, tx T) ([]byte, error) {
				if err := s.effect(v, tx, "order-1", "A1"); err != nil {
					return nil, err
				}
				return nil, idemcore.Retryable(errBusy)
			}, nil)
			close(release)
			for _, o := range []outcome{<-leader, <-waiters, <-waiters} {
				require.ErrorIs(t, o.err, idemcore.ErrRetryable)
				require.ErrorIs(t, o.err, errBusy, "waiters get the same err")
			}
			require.Nil(t, record(t, e, "k"), "the key is free")
			s.wantEffects(t, e, v, map[string]string{}, "nothing of fn's committed")
			res, err := call(bg, e, v, "k", []byte("another request"), func(ctx context.Context, _ T) ([]byte, error) {
				wantCall(t, ctx, idemcore.Call{Key: "k", Attempt: 1})
				return []byte("second"), nil
			})
			require.NoError(t, err, "the key is new: any fingerprint")
			require.False(t, res.Replayed)
			require.Equal(t, 1, res.Attempt)
		})
	})

	t.Run("a failed call's Result carries no response", func(t *testing.T) {
		// fn's bytes beside an outcome that is not stored (Retryable, an
		// interruption) are no answer: neither the caller nor its waiters get
		// them, as Result.Response, whatever fn returned.
		both(t, func(t *testing.T, v via) {
			e, _ := s.fresh(t, Options{})
			release, leader, waiters := s.leaderWithWaiters(t, e, v, "retryable", 2, func(context.Context, T) ([]byte, error) {
				return []byte("never stored"), idemcore.Retryable(errors.New("gateway busy"))
			}, nil)
			close(release)
			for i, o := range []outcome{<-leader, <-waiters, <-waiters} {
				require.ErrorIs(t, o.err, idemcore.ErrRetryable)
				assert.Nil(t, o.res.Response, "Retryable, call %d (0: the caller, then its waiters)", i)
			}

			s.interrupt(t, e, "recovering")
			res, err := call(bg, e, v, "recovering", fp, func(context.Context, T) ([]byte, error) {
				return []byte("never stored"), idemcore.Retryable(errors.New("gateway busy"))
			})
			require.ErrorIs(t, err, idemcore.ErrRetryable)
			assert.Nil(t, res.Response, "Retryable while recovering an interrupted execution")
			require.Equal(t, idemcore.StateStarted, record(t, e, "recovering").State)

			ctx, cancel := context.WithCancel(bg)
			res, err = call(ctx, e, v, "interrupted", fp, func(ctx context.Context, _ T) ([]byte, error) {
				cancel()
				return []byte("never stored"), fmt.Errorf("gateway: %w", ctx.Err())
			})
			require.ErrorIs(t, err, context.Canceled)
			assert.Nil(t, res.Response, "an error after fn's own context ended")
		})
	})

	t.Run("fn returns an error after its own context ended", func(t *testing.T) {
		t.Run("caller's ctx/Do", func(t *testing.T) {
			e, _ := s.fresh(t, Options{})
			ctx, cancel := context.WithCancel(bg)
			defer cancel()
			entered := make(chan struct{})
			leader := make(chan outcome, 1)
			go func() {
				leader <- callRecovering(ctx, e, viaDo, "k", fp, func(ctx context.Context, _ T) ([]byte, error) {
					close(entered)
					<-ctx.Done()
					return nil, fmt.Errorf("gateway: %w", ctx.Err())
				})
			}()
			<-entered
			waiters := make(chan outcome, 2)
			s.waitersIn(t, 2, func() {
				for range 2 {
					go func() { waiters <- callRecovering(bg, e, viaDo, "k", fp, mustNotRun[T](t)) }()
				}
			})
			cancel()
			l := <-leader
			require.ErrorIs(t, l.err, context.Canceled, "the caller gets fn's error")
			for range 2 {
				require.ErrorIs(t, (<-waiters).err, idemcore.ErrIncomplete)
			}
			r := record(t, e, "k")
			require.Equal(t, idemcore.StateStarted, r.State, "unknown outcome: stays started")
			require.Equal(t, 1, r.Attempt)
		})
		t.Run("caller's ctx/DoTx", func(t *testing.T) {
			// DoTx has no started record: nothing of fn's committed, so the
			// key is free and a waiter leads.
			e, _ := s.fresh(t, Options{})
			ctx, cancel := context.WithCancel(bg)
			defer cancel()
			release, leader, waiters := s.leaderWithWaitersCtx(ctx, t, e, viaDoTx, "k", 2, func(ctx context.Context, tx T) ([]byte, error) {
				if err := s.h.PutEffect(tx, "leader", "x"); err != nil {
					return nil, err
				}
				cancel() // the caller gives up while fn runs
				<-ctx.Done()
				return nil, fmt.Errorf("gateway: %w", ctx.Err())
			}, func(ctx context.Context, tx T) ([]byte, error) {
				return []byte("from a waiter"), s.h.PutEffect(tx, "waiter", "y")
			})
			close(release)
			require.ErrorIs(t, (<-leader).err, context.Canceled)
			replays := 0
			for range 2 {
				w := <-waiters
				require.NoError(t, w.err)
				require.Equal(t, "from a waiter", string(w.res.Response))
				if w.res.Replayed {
					replays++
				}
			}
			require.Equal(t, 1, replays, "one waiter led, the other waited for it")
			require.Equal(t, map[string]string{"waiter": "y"}, s.effects(t, e))
		})
		t.Run("Close", func(t *testing.T) {
			e, store := s.fresh(t, Options{})
			entered := make(chan struct{})
			leader := make(chan outcome, 1)
			go func() {
				leader <- callRecovering(bg, e, viaDo, "k", fp, func(ctx context.Context, _ T) ([]byte, error) {
					close(entered)
					<-ctx.Done() // ends on Close
					return nil, fmt.Errorf("gateway: %w", ctx.Err())
				})
			}()
			<-entered
			require.NoError(t, e.Close())
			require.ErrorIs(t, (<-leader).err, context.Canceled)
			e = s.open(t, store, Options{})
			r := record(t, e, "k")
			require.Equal(t, idemcore.StateStarted, r.State, "an interrupted execution")
			res, err := call(bg, e, viaDo, "k", fp, func(ctx context.Context, _ T) ([]byte, error) {
				wantCall(t, ctx, idemcore.Call{Key: "k", Attempt: 2, Recovered: true})
				return []byte("ok"), nil
			})
			require.NoError(t, err)
			require.Equal(t, 2, res.Attempt)
		})
	})

	t.Run("fn returns a context error of its own making", func(t *testing.T) {
		both(t, func(t *testing.T, v via) {
			e, store := s.fresh(t, Options{})
			release, leader, waiters := s.leaderWithWaiters(t, e, v, "k", 1, func(ctx context.Context, tx T) ([]byte, error) {
				// fn's own call to a gateway timed out; fn's context is live.
				down, cancel := context.WithTimeout(ctx, 0)
				defer cancel()
				<-down.Done()
				return nil, idemcore.WithCode(fmt.Errorf("gateway: %w", down.Err()), "downstream_timeout")
			}, nil)
			close(release)
			l := <-leader
			var ie *idemcore.Error
			require.ErrorAs(t, l.err, &ie, "an outcome, as any permanent error")
			require.Equal(t, "downstream_timeout", ie.Code)
			require.ErrorIs(t, l.err, context.DeadlineExceeded)
			w := <-waiters
			require.ErrorAs(t, w.err, &ie)
			require.Equal(t, "downstream_timeout", ie.Code, "waiters get the same")
			e = s.reopen(t, e, store, Options{})
			r := record(t, e, "k")
			require.NotNil(t, r)
			require.Equal(t, idemcore.StateDone, r.State)
			require.Equal(t, "downstream_timeout", r.Err.Code)
		})
	})

	t.Run("fn panics", func(t *testing.T) {
		t.Run("Do", func(t *testing.T) {
			e, _ := s.fresh(t, Options{})
			release, leader, waiters := s.leaderWithWaiters(t, e, viaDo, "k", 2, func(context.Context, T) ([]byte, error) {
				panic("boom")
			}, nil)
			close(release)
			require.Equal(t, "boom", (<-leader).panicked, "the caller gets the panic value")
			for range 2 {
				require.ErrorIs(t, (<-waiters).err, idemcore.ErrIncomplete)
			}
			r := record(t, e, "k")
			require.Equal(t, idemcore.StateStarted, r.State, "stays started, as after a crash")
			res, err := call(bg, e, viaDo, "k", fp, func(ctx context.Context, _ T) ([]byte, error) {
				wantCall(t, ctx, idemcore.Call{Key: "k", Attempt: 2, Recovered: true})
				return []byte("ok"), nil
			})
			require.NoError(t, err, "the key is not wedged")
			require.Equal(t, 2, res.Attempt)
		})
		t.Run("DoTx", func(t *testing.T) {
			e, _ := s.fresh(t, Options{})
			o := callRecovering(bg, e, viaDoTx, "k", fp, func(ctx context.Context, tx T) ([]byte, error) {
				if err := s.h.PutEffect(tx, "order-1", "A1"); err != nil {
					return nil, err
				}
				panic("boom")
			})
			requirePanicValue(t, "boom", o.panicked)
			require.Nil(t, record(t, e, "k"), "DoTx has no started record: nothing stored")
			require.Empty(t, s.effects(t, e), "nothing of fn's committed")
			res, err := call(bg, e, viaDoTx, "k", fp, ok[T]("ok"))
			require.NoError(t, err, "the key is free")
			require.False(t, res.Replayed)
		})
		t.Run("DoTx waiters", func(t *testing.T) {
			// Nothing was stored and the key is free: waiters are not told
			// to resolve it (ErrIncomplete); they may lead.
			e, _ := s.fresh(t, Options{})
			release, leader, waiters := s.leaderWithWaiters(t, e, viaDoTx, "k", 2, func(context.Context, T) ([]byte, error) {
				panic("boom")
			}, ok[T]("from a waiter"))
			close(release)
			requirePanicValue(t, "boom", (<-leader).panicked)
			for range 2 {
				w := <-waiters
				require.NotErrorIs(t, w.err, idemcore.ErrIncomplete)
			}
		})
	})

	t.Run("response larger than the limit", func(t *testing.T) {
		both(t, func(t *testing.T, v via) {
			opts := Options{MaxResponseSize: 8}
			e, store := s.fresh(t, opts)
			runs := 0
			release, leader, waiters := s.leaderWithWaiters(t, e, v, "k", 1, func(ctx context.Context, tx T) ([]byte, error) {
				runs++
				return []byte("123456789"), s.effect(v, tx, "order-1", "A1")
			}, nil)
			close(release)
			for _, o := range []outcome{<-leader, <-waiters} {
				require.ErrorIs(t, o.err, idemcore.ErrResponseTooLarge)
				require.Nil(t, o.res.Response, "never truncated")
			}
			r := record(t, e, "k")
			require.Equal(t, idemcore.StateDone, r.State, "fails closed: done with the error")
			require.Nil(t, r.Response)
			require.ErrorIs(t, r.Err, idemcore.ErrResponseTooLarge)
			s.wantEffects(t, e, v, map[string]string{}, "fn's writes roll back")

			e = s.reopen(t, e, store, opts)
			res, err := call(bg, e, v, "k", fp, mustNotRun[T](t))
			require.ErrorIs(t, err, idemcore.ErrResponseTooLarge, "replayed, also after a restart: never re-run")
			require.True(t, res.Replayed)

			// The limit covers the stored error's text too; at the limit is fine.
			_, err = call(bg, e, v, "k2", fp, func(context.Context, T) ([]byte, error) {
				return []byte("1234"), errors.New("0123456789")
			})
			require.ErrorIs(t, err, idemcore.ErrResponseTooLarge)
			res, err = call(bg, e, v, "k3", fp, ok[T]("12345678"))
			require.NoError(t, err)
			require.Equal(t, "12345678", string(res.Response))
		})
	})

	t.Run("caller's ctx cancelled before the started commit", func(t *testing.T) {
		both(t, func(t *testing.T, v via) {
			e, _ := s.fresh(t, Options{})
			ctx, cancel := context.WithCancel(bg)
			cancel()
			_, err := call(ctx, e, v, "k", fp, mustNotRun[T](t))
			require.ErrorIs(t, err, context.Canceled)
			require.Nil(t, record(t, e, "k"), "nothing stored")
		})
	})

	t.Run("caller's ctx cancelled after the started commit, before fn starts", func(t *testing.T) {
		// Do only: DoTx commits no started record.
		e, _ := s.fresh(t, Options{})
		ctx, cancel := context.WithCancel(bg)
		defer cancel()
		waiter := make(chan outcome, 1)
		fired := false
		unset := s.h.Hook(PointAfterStarted, func() {
			if fired {
				return
			}
			fired = true
			// A duplicate arrives and waits, then the leader's caller gives up.
			s.waitersIn(t, 1, func() {
				go func() { waiter <- callRecovering(bg, e, viaDo, "k", fp, ok[T]("from the waiter")) }()
			})
			cancel()
		})
		defer unset()
		_, err := call(ctx, e, viaDo, "k", fp, mustNotRun[T](t))
		require.ErrorIs(t, err, context.Canceled)
		w := <-waiter
		require.NoError(t, w.err, "the leader is gone: the waiter became the new leader")
		require.Equal(t, "from the waiter", string(w.res.Response))
		require.False(t, w.res.Replayed)
		require.Equal(t, 1, w.res.Attempt, "the cancelled leader's started record was deleted")
	})

	t.Run("caller's ctx cancelled after fn returned", func(t *testing.T) {
		both(t, func(t *testing.T, v via) {
			e, _ := s.fresh(t, Options{})
			ctx, cancel := context.WithCancel(bg)
			res, err := call(ctx, e, v, "k", fp, func(ctx context.Context, tx T) ([]byte, error) {
				cancel()
				return []byte("done anyway"), s.effect(v, tx, "order-1", "A1")
			})
			require.NoError(t, err, "recording finishes regardless of ctx")
			require.Equal(t, "done anyway", string(res.Response))
			require.Equal(t, idemcore.StateDone, record(t, e, "k").State)
			s.wantEffects(t, e, v, map[string]string{"order-1": "A1"}, "")
		})
	})

	t.Run("a waiter's own ctx cancelled while waiting", func(t *testing.T) {
		both(t, func(t *testing.T, v via) {
			e, _ := s.fresh(t, Options{})
			release, leader, waiters := s.leaderWithWaiters(t, e, v, "k", 1, ok[T]("v"), nil)
			ctx, cancel := context.WithCancel(bg)
			mine := make(chan error, 1)
			s.waitersIn(t, 1, func() {
				go func() {
					_, err := call(ctx, e, v, "k", fp, mustNotRun[T](t))
					mine <- err
				}()
			})
			cancel()
			require.ErrorIs(t, <-mine, context.Canceled)
			close(release)
			require.NoError(t, (<-leader).err, "the leader is unaffected")
			w := <-waiters
			require.NoError(t, w.err, "the other waiter is unaffected")
			require.Equal(t, "v", string(w.res.Response))
			require.Equal(t, idemcore.StateDone, record(t, e, "k").State)
		})
	})
}

// requirePanicValue checks that got is the panic value want, as Do re-raises
// it, or a *idem.PanicError carrying it, as DoTx does.
func requirePanicValue(t testing.TB, want, got any) {
	t.Helper()
	if pe, ok := got.(*idemcore.PanicError); ok {
		got = pe.Value
	}
	require.Equal(t, want, got, "the caller gets fn's panic value")
}
