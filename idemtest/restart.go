package idemtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemcore"
)

// restart holds what survives a restart (contract 4 and 8): replays are
// exact, nil and empty responses stay different, an interrupted execution
// found at Open is recovered, and a closed engine refuses calls.
func (s *suite[T]) restart(t *testing.T) {
	t.Run("invalid engine options are refused at Open, and nothing stored is lost", func(t *testing.T) {
		e, store := s.fresh(t, Options{})
		_, err := e.Do(bg, "k", fp, func(context.Context) ([]byte, error) { return []byte("kept"), nil })
		require.NoError(t, err)
		require.NoError(t, e.Close())
		for name, o := range map[string]Options{
			"negative Retention":             {Retention: -time.Hour},
			"negative RetryAfter":            {RetryAfter: -time.Second},
			"unknown InFlight":               {InFlight: idemcore.InFlightFail + 1},
			"unknown Recovery":               {Recovery: idemcore.RecoverRefuse + 1},
			"negative Workers":               {Outbox: idemcore.OutboxOptions{Workers: -1}},
			"negative BaseBackoff":           {Outbox: idemcore.OutboxOptions{BaseBackoff: -time.Second}},
			"negative MaxBackoff":            {Outbox: idemcore.OutboxOptions{MaxBackoff: -time.Second}},
			"negative dead-letter retention": {Outbox: idemcore.OutboxOptions{DeadLetterRetention: -time.Hour}},
			"negative PollInterval":          {Outbox: idemcore.OutboxOptions{PollInterval: -time.Second}},
		} {
			o.Now = newClock().Now
			bad, err := s.h.Open(t, store, o)
			if err == nil {
				_ = bad.Close()
			}
			require.ErrorIs(t, err, idemcore.ErrOptions, "%s: a clear error, never a silent default", name)
		}
		e = s.open(t, store, Options{})
		res, err := call(bg, e, viaDo, "k", fp, mustNotRun[T](t))
		require.NoError(t, err)
		require.True(t, res.Replayed)
		require.Equal(t, "kept", string(res.Response), "a refused Open changed nothing")
	})

	t.Run("nil and empty responses differ", func(t *testing.T) {
		both(t, func(t *testing.T, v via) {
			e, store := s.fresh(t, Options{})
			cases := []struct {
				key  string
				resp []byte
				err  error
			}{
				{"nil", nil, nil},
				{"empty", []byte{}, nil},
				{"nil-with-error", nil, errors.New("failed")},
				{"empty-with-error", []byte{}, errors.New("failed")},
			}
			want := func(t *testing.T, key string, wantNil bool, got []byte, when string) {
				t.Helper()
				if wantNil {
					require.Nil(t, got, "%s: %s", key, when)
				} else {
					require.NotNil(t, got, "%s: %s", key, when)
					require.Empty(t, got, "%s: %s", key, when)
				}
			}
			for _, c := range cases {
				release, leader, waiters := s.leaderWithWaiters(t, e, v, c.key, 1, func(context.Context, T) ([]byte, error) {
					return c.resp, c.err
				}, nil)
				close(release)
				want(t, c.key, c.resp == nil, (<-leader).res.Response, "first answer")
				want(t, c.key, c.resp == nil, (<-waiters).res.Response, "waiter")
				res, _ := call(bg, e, v, c.key, fp, mustNotRun[T](t))
				want(t, c.key, c.resp == nil, res.Response, "replay")
				want(t, c.key, c.resp == nil, record(t, e, c.key).Response, "Get")
			}
			e = s.reopen(t, e, store, Options{})
			for _, c := range cases {
				res, _ := call(bg, e, v, c.key, fp, mustNotRun[T](t))
				require.True(t, res.Replayed)
				want(t, c.key, c.resp == nil, res.Response, "replay after a restart")
				want(t, c.key, c.resp == nil, record(t, e, c.key).Response, "Get after a restart")
			}
		})
	})

	t.Run("replays after a restart are exact", func(t *testing.T) {
		c := newClock()
		opts := Options{Now: c.Now}
		e, store := s.fresh(t, opts)
		type answer struct {
			res idemcore.Result
			err error
		}
		first := map[string]answer{}
		for key, fn := range map[string]func(context.Context) ([]byte, error){
			"resp":      func(context.Context) ([]byte, error) { return []byte(`{"order":"ord_1"}`), nil },
			"coded":     func(context.Context) ([]byte, error) { return nil, idemcore.WithCode(errDeclined, "card_declined") },
			"uncoded":   func(context.Context) ([]byte, error) { return nil, errors.New("no such sku") },
			"both":      func(context.Context) ([]byte, error) { return []byte("partial"), errors.New("half done") },
			"recovered": nil,
		} {
			if fn == nil {
				s.interrupt(t, e, key)
				fn = func(context.Context) ([]byte, error) { return []byte("second try"), nil }
			}
			res, err := e.Do(bg, key, fp, fn)
			first[key] = answer{res, err}
			c.Advance(time.Second)
		}
		e = s.reopen(t, e, store, opts)
		for key, a := range first {
			res, err := call(bg, e, viaDo, key, fp, mustNotRun[T](t))
			require.True(t, res.Replayed, key)
			require.Equal(t, a.res.Response, res.Response, key)
			require.Equal(t, a.res.Attempt, res.Attempt, key)
			require.True(t, a.res.StartedAt.Equal(res.StartedAt), key)
			require.True(t, a.res.CompletedAt.Equal(res.CompletedAt), key)
			if a.err == nil {
				require.NoError(t, err, key)
				continue
			}
			var was, is *idemcore.Error
			require.ErrorAs(t, a.err, &was, key)
			require.ErrorAs(t, err, &is, key)
			require.Equal(t, was.Code, is.Code, key)
			require.Equal(t, was.Message, is.Message, key)
			require.Equal(t, a.err.Error(), err.Error(), key)
		}
	})

	t.Run("an interrupted execution found at Open is recovered", func(t *testing.T) {
		e, store := s.fresh(t, Options{})
		s.interrupt(t, e, "k")
		require.NoError(t, e.Close())
		if s.h.OwnedAcrossProcesses {
			s.h.ExpireOwners(t, store)
		}
		e = s.open(t, store, Options{})
		res, err := e.Do(bg, "k", fp, func(ctx context.Context) ([]byte, error) {
			wantCall(t, ctx, idemcore.Call{Key: "k", Attempt: 2, Recovered: true})
			return []byte("ok"), nil
		})
		require.NoError(t, err)
		require.Equal(t, 2, res.Attempt)
	})

	t.Run("calls after Close fail with ErrClosed", func(t *testing.T) {
		e, _ := s.fresh(t, Options{})
		_, err := e.Do(bg, "k", fp, func(context.Context) ([]byte, error) { return []byte("v"), nil })
		require.NoError(t, err)
		require.NoError(t, e.Close())
		for _, v := range []via{viaDo, viaDoTx} {
			_, err := call(bg, e, v, "k", fp, mustNotRun[T](t))
			require.ErrorIs(t, err, idemcore.ErrClosed, "%s of a done key", v)
			_, err = call(bg, e, v, "new", fp, mustNotRun[T](t))
			require.ErrorIs(t, err, idemcore.ErrClosed, "%s of a new key", v)
		}
		_, err = e.Get("k")
		require.ErrorIs(t, err, idemcore.ErrClosed)
		require.NoError(t, e.Close(), "Close is idempotent")
	})
}
