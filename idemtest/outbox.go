package idemtest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/internal/testkit"
)

// messages returns the outbox's messages, pending then dead.
func messages[T any](t testing.TB, e Engine[T]) []*idemcore.Message {
	t.Helper()
	var out []*idemcore.Message
	if err := e.Messages(func(m *idemcore.Message, err error) error {
		if err != nil {
			return err
		}
		out = append(out, m)
		return nil
	}); err != nil {
		t.Fatalf("messages: %v", err)
	}
	return out
}

// outboxOptions runs the dispatcher with handlers, polling every millisecond.
func outboxOptions(c *testkit.Clock, handlers map[string]idemcore.Handler, o idemcore.OutboxOptions) Options {
	o.Dispatch, o.Handlers, o.PollInterval = true, handlers, time.Millisecond
	return Options{Now: c.Now, Outbox: o}
}

// enqueue runs a DoTx with key that enqueues one message per payload on
// topic and writes one effect row.
func (s *suite[T]) enqueue(t testing.TB, e Engine[T], key, topic string, payloads ...[]byte) {
	t.Helper()
	_, err := e.DoTx(bg, key, fp, func(ctx context.Context, tx T) ([]byte, error) {
		for _, p := range payloads {
			if err := s.h.Enqueue(tx, topic, p); err != nil {
				return nil, err
			}
		}
		return nil, s.h.PutEffect(tx, key, "enqueued")
	})
	require.NoError(t, err)
}

// outbox holds contract 10: messages enqueued in a DoTx commit with it and
// are delivered at least once, passing a downstream key on, in enqueue order
// per ordering key, with backoff and dead letters, and nothing lost on
// restart.
func (s *suite[T]) outbox(t *testing.T) {
	t.Run("enqueued in DoTx, delivered with downstream keys", func(t *testing.T) {
		c := newClock()
		var rec testkit.Recorder
		e, _ := s.fresh(t, outboxOptions(c, map[string]idemcore.Handler{"charge": rec.Handler(nil), "email": rec.Handler(nil)}, idemcore.OutboxOptions{}))
		_, err := e.DoTx(bg, "order-1", fp, func(ctx context.Context, tx T) ([]byte, error) {
			for _, m := range []struct {
				topic   string
				payload []byte
			}{{"charge", []byte("1200")}, {"email", nil}, {"charge", []byte{}}} {
				if err := s.h.Enqueue(tx, m.topic, m.payload); err != nil {
					return nil, err
				}
			}
			return []byte("ord_1"), nil
		})
		require.NoError(t, err)
		testkit.Eventually(t, "3 deliveries", nil, func() bool { return len(rec.Delivered()) == 3 })
		testkit.Eventually(t, "their removal", nil, func() bool { return len(messages(t, e)) == 0 })
		got := rec.Delivered()
		for i, m := range got {
			require.Equal(t, "order-1", m.Key)
			require.Equal(t, i, m.Index, "one ordering key: enqueue order")
			require.Equal(t, idemcore.DownstreamKey("order-1", i), m.DownstreamKey)
			require.Equal(t, "order-1", m.OrderingKey)
			require.Equal(t, 1, m.Attempt)
			require.Equal(t, start, m.EnqueuedAt.UTC())
		}
		require.Equal(t, []string{"charge", "email", "charge"}, []string{got[0].Topic, got[1].Topic, got[2].Topic})
		require.Equal(t, []byte("1200"), got[0].Payload)
		require.Nil(t, got[1].Payload, "a nil payload stays nil")
		require.NotNil(t, got[2].Payload, "an empty payload stays empty")
		require.Empty(t, got[2].Payload)

		_, err = e.DoTx(bg, "order-1", fp, func(ctx context.Context, tx T) ([]byte, error) {
			return nil, s.h.Enqueue(tx, "charge", []byte("again"))
		})
		require.NoError(t, err)
		require.Empty(t, messages(t, e), "a replay enqueues nothing")
	})

	t.Run("a DoTx without an outcome enqueues nothing", func(t *testing.T) {
		c := newClock()
		// No dispatcher: what is stored stays visible to Messages.
		e, _ := s.fresh(t, Options{Now: c.Now})
		for key, end := range map[string]func() ([]byte, error){
			"permanent": func() ([]byte, error) { return nil, errors.New("declined") },
			"retryable": func() ([]byte, error) { return nil, idemcore.Retryable(errors.New("busy")) },
			"too large": func() ([]byte, error) { return make([]byte, idemcore.DefaultMaxResponseSize+1), nil },
			"panic":     func() ([]byte, error) { panic("boom") },
		} {
			o := callRecovering(bg, e, viaDoTx, key, fp, func(ctx context.Context, tx T) ([]byte, error) {
				if err := s.h.Enqueue(tx, "charge", []byte(key)); err != nil {
					return nil, err
				}
				return end()
			})
			require.True(t, o.err != nil || o.panicked != nil, key)
			require.Empty(t, messages(t, e), "%s: the message rolls back with fn's writes", key)
		}
	})

	t.Run("a failed attempt is retried after a backoff, with the same downstream key", func(t *testing.T) {
		c := newClock()
		var rec testkit.Recorder
		h := rec.Handler(func(m idemcore.Message) error {
			if m.Attempt <= 2 {
				return fmt.Errorf("gateway timeout %d", m.Attempt)
			}
			return nil
		})
		e, _ := s.fresh(t, outboxOptions(c, map[string]idemcore.Handler{"charge": h},
			idemcore.OutboxOptions{BaseBackoff: time.Second, MaxBackoff: time.Minute, MaxAttempts: 10}))
		s.enqueue(t, e, "order-1", "charge", []byte("1200"))
		testkit.Eventually(t, "the first failure recorded", nil, func() bool {
			ms := messages(t, e)
			return len(ms) == 1 && ms[0].Failures == 1
		})
		m := messages(t, e)[0]
		require.Equal(t, "gateway timeout 1", m.LastError)
		require.False(t, m.NextAttemptAt.Before(start.Add(500*time.Millisecond)), "the backoff is at least BaseBackoff/2")
		require.False(t, m.NextAttemptAt.After(start.Add(time.Second)), "the backoff is at most BaseBackoff")
		require.Len(t, rec.Attempts(), 1, "the clock has not moved: no retry yet")

		testkit.Eventually(t, "delivery", func() { c.Advance(time.Minute) }, func() bool { return len(rec.Delivered()) == 1 })
		got := rec.Attempts()
		require.Len(t, got, 3)
		for i, m := range got {
			require.Equal(t, i+1, m.Attempt)
			require.Equal(t, idemcore.DownstreamKey("order-1", 0), m.DownstreamKey, "every attempt passes the same key on")
		}
		testkit.Eventually(t, "its removal", nil, func() bool { return len(messages(t, e)) == 0 })
	})

	t.Run("dead letters: listed, retried, dropped", func(t *testing.T) {
		c := newClock()
		var rec testkit.Recorder
		var healthy atomic.Bool
		h := rec.Handler(func(m idemcore.Message) error {
			if healthy.Load() {
				return nil
			}
			return errors.New("gateway down")
		})
		e, _ := s.fresh(t, outboxOptions(c, map[string]idemcore.Handler{"charge": h},
			idemcore.OutboxOptions{BaseBackoff: time.Second, MaxBackoff: time.Second, MaxAttempts: 2}))
		s.enqueue(t, e, "order-1", "charge", []byte("a"))
		s.enqueue(t, e, "order-2", "charge", []byte("b"))
		dead := func() []*idemcore.Message {
			var out []*idemcore.Message
			for _, m := range messages(t, e) {
				if m.Dead {
					out = append(out, m)
				}
			}
			return out
		}
		testkit.Eventually(t, "two dead letters", func() { c.Advance(time.Minute) }, func() bool { return len(dead()) == 2 })
		require.Len(t, rec.Attempts(), 4, "MaxAttempts each, then no more")
		ds := dead()
		require.Equal(t, "gateway down", ds[0].LastError)
		require.False(t, ds[0].DeadAt.IsZero())
		require.ErrorIs(t, e.RetryDead(ds[0].Seq+ds[1].Seq+100), idemcore.ErrMessageNotFound)

		healthy.Store(true)
		require.NoError(t, e.DropDead(ds[1].Seq))
		require.NoError(t, e.RetryDead(ds[0].Seq))
		testkit.Eventually(t, "the retried letter's delivery", nil, func() bool { return len(rec.Delivered()) == 1 })
		testkit.Eventually(t, "an empty outbox", nil, func() bool { return len(messages(t, e)) == 0 })
		d := rec.Delivered()[0]
		require.Equal(t, []byte("a"), d.Payload)
		require.Equal(t, idemcore.DownstreamKey("order-1", 0), d.DownstreamKey)
		require.ErrorIs(t, e.DropDead(ds[1].Seq), idemcore.ErrMessageNotFound, "dropped already")
	})

	t.Run("a topic with NUL is refused, nothing enqueued", func(t *testing.T) {
		c := newClock()
		e, _ := s.fresh(t, Options{Now: c.Now})
		_, err := e.DoTx(bg, "nul-topic", fp, func(ctx context.Context, tx T) ([]byte, error) {
			return nil, s.h.Enqueue(tx, "char\x00ge", nil)
		})
		require.ErrorIs(t, err, idemcore.ErrInvalidMessage)
		require.Empty(t, messages(t, e))
	})

	t.Run("a handler error of any bytes reaches the dead letters, cut at a rune boundary", func(t *testing.T) {
		c := newClock()
		long := "x" + strings.Repeat("é", 2500) // 5001 bytes: byte 4096 is inside a rune
		errs := map[string]string{"nul": "bad \x00 byte", "invalid": "bad \xff\xfe bytes", "long": long}
		h := func(ctx context.Context, m idemcore.Message) error { return errors.New(errs[string(m.Payload)]) }
		e, _ := s.fresh(t, outboxOptions(c, map[string]idemcore.Handler{"charge": h}, idemcore.OutboxOptions{MaxAttempts: 1}))
		s.enqueue(t, e, "order-1", "charge", []byte("nul"), []byte("invalid"), []byte("long"))
		dead := func() map[string]string {
			out := map[string]string{}
			for _, m := range messages(t, e) {
				if m.Dead {
					out[string(m.Payload)] = m.LastError
				}
			}
			return out
		}
		testkit.Eventually(t, "three dead letters", nil, func() bool { return len(dead()) == 3 })
		got := dead()
		require.Equal(t, errs["nul"], got["nul"])
		require.Equal(t, errs["invalid"], got["invalid"])
		require.True(t, got["long"] == long[:4096-1], "the first 4 KiB, less the half rune: got %d bytes", len(got["long"]))
	})

	t.Run("a dead letter does not hold back its ordering key", func(t *testing.T) {
		c := newClock()
		var rec testkit.Recorder
		h := rec.Handler(func(m idemcore.Message) error {
			if string(m.Payload) == "poison" {
				return errors.New("rejected")
			}
			return nil
		})
		e, _ := s.fresh(t, outboxOptions(c, map[string]idemcore.Handler{"charge": h}, idemcore.OutboxOptions{MaxAttempts: 1}))
		s.enqueue(t, e, "order-1", "charge", []byte("poison"), []byte("next"))
		testkit.Eventually(t, "the next message's delivery", nil, func() bool { return len(rec.Delivered()) == 1 })
		require.Equal(t, []byte("next"), rec.Delivered()[0].Payload)
		testkit.Eventually(t, "its removal", nil, func() bool { return len(messages(t, e)) == 1 })
		ms := messages(t, e)
		require.True(t, ms[0].Dead)
		require.Equal(t, []byte("poison"), ms[0].Payload)
	})

	t.Run("enqueue order per ordering key", func(t *testing.T) {
		c := newClock()
		var rec testkit.Recorder
		e, _ := s.fresh(t, outboxOptions(c, map[string]idemcore.Handler{"step": rec.Handler(nil)}, idemcore.OutboxOptions{}))
		var payloads [][]byte
		for i := range 8 {
			payloads = append(payloads, fmt.Appendf(nil, "%d", i))
		}
		s.enqueue(t, e, "saga-1", "step", payloads...)
		s.enqueue(t, e, "saga-2", "step", payloads...)
		testkit.Eventually(t, "16 deliveries", nil, func() bool { return len(rec.Delivered()) == 16 })
		next := map[string]int{}
		for _, m := range rec.Delivered() {
			require.Equal(t, next[m.OrderingKey], m.Index, "%s delivered out of order", m.OrderingKey)
			require.Equal(t, fmt.Sprint(m.Index), string(m.Payload))
			next[m.OrderingKey]++
		}
	})

	t.Run("Close cancels a running handler, and its attempt does not count", func(t *testing.T) {
		c := newClock()
		entered := make(chan struct{})
		var once sync.Once
		blocking := func(ctx context.Context, m idemcore.Message) error {
			once.Do(func() { close(entered) })
			<-ctx.Done()
			return ctx.Err()
		}
		e, store := s.fresh(t, outboxOptions(c, map[string]idemcore.Handler{"charge": blocking}, idemcore.OutboxOptions{}))
		s.enqueue(t, e, "order-1", "charge", []byte("1200"))
		<-entered
		require.NoError(t, e.Close(), "Close returns once the handler it cancelled returned")
		var rec testkit.Recorder
		e = s.open(t, store, outboxOptions(c, map[string]idemcore.Handler{"charge": rec.Handler(nil)}, idemcore.OutboxOptions{}))
		testkit.Eventually(t, "delivery after the restart", nil, func() bool { return len(rec.Delivered()) == 1 })
		m := rec.Delivered()[0]
		require.Equal(t, 1, m.Attempt, "the cancelled attempt is not counted")
		require.Equal(t, idemcore.DownstreamKey("order-1", 0), m.DownstreamKey)
	})

	t.Run("nothing is lost on restart", func(t *testing.T) {
		c := newClock()
		// First without a handler for the topic: the message waits.
		e, store := s.fresh(t, outboxOptions(c, map[string]idemcore.Handler{}, idemcore.OutboxOptions{}))
		s.enqueue(t, e, "order-1", "charge", []byte("1200"))
		require.Len(t, messages(t, e), 1)
		var rec testkit.Recorder
		e = s.reopen(t, e, store, outboxOptions(c, map[string]idemcore.Handler{"charge": rec.Handler(nil)}, idemcore.OutboxOptions{}))
		testkit.Eventually(t, "delivery after the restart", nil, func() bool { return len(rec.Delivered()) == 1 })
		m := rec.Delivered()[0]
		require.Equal(t, idemcore.DownstreamKey("order-1", 0), m.DownstreamKey)
		require.Equal(t, []byte("1200"), m.Payload)
		require.Equal(t, map[string]string{"order-1": "enqueued"}, s.effects(t, e), "the effect committed with its message")
	})
}
