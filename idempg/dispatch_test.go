package idempg_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idempg"
	"github.com/idemkit/idem/idempg/internal/pgtest"
)

// TestDispatchAcrossEngines: DoTx calls enqueue messages of a few ordering
// keys; the dispatchers of two engines (two processes' worth) deliver every
// message, each ordering key's in enqueue order, with its downstream key; a
// handler that keeps failing sends its message to the dead letters after
// MaxAttempts, and RetryDead brings it back.
func TestDispatchAcrossEngines(t *testing.T) {
	for _, env := range []string{pgtest.Env, pgtest.BouncerEnv} {
		t.Run(env, func(t *testing.T) {
			st := newStore(t, env)
			var (
				mu        sync.Mutex
				delivered = map[string][]string{} // ordering key → payloads
				keys      = map[string]bool{}
				fails     = map[string]int{}
				total     = make(chan struct{}, 100)
			)
			handler := func(ctx context.Context, m idemcore.Message) error {
				mu.Lock()
				defer mu.Unlock()
				if string(m.Payload) == "poison" {
					fails[m.DownstreamKey]++
					return errors.New("poison")
				}
				delivered[m.OrderingKey] = append(delivered[m.OrderingKey], string(m.Payload))
				keys[m.DownstreamKey] = true
				total <- struct{}{}
				return nil
			}
			eo := func() *idemcore.Options {
				return &idemcore.Options{Outbox: idemcore.OutboxOptions{Dispatch: true, Handlers: map[string]idemcore.Handler{"t": handler},
					BaseBackoff: time.Millisecond, MaxBackoff: time.Millisecond, MaxAttempts: 3, PollInterval: 20 * time.Millisecond}}
			}
			a, b := st.open(t, eo()), st.open(t, eo())
			ctx := context.Background()
			const calls = 10
			for i := range calls {
				e := a
				if i%2 == 1 {
					e = b
				}
				_, err := e.DoTx(ctx, fmt.Sprintf("call-%d", i), nil, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
					for _, ok := range []string{"x", "y"} {
						if err := idempg.EnqueueOrdered(tx, "t", ok, fmt.Appendf(nil, "%s-%02d", ok, i)); err != nil {
							return nil, err
						}
					}
					return nil, nil
				})
				if err != nil {
					t.Fatal(err)
				}
			}
			if _, err := a.DoTx(ctx, "poisoned", nil, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
				return nil, idempg.Enqueue(tx, "t", []byte("poison"))
			}); err != nil {
				t.Fatal(err)
			}
			for range 2 * calls {
				select {
				case <-total:
				case <-time.After(30 * time.Second): // a bound on a hang
					t.Fatal("not every message was delivered")
				}
			}
			mu.Lock()
			for _, ok := range []string{"x", "y"} {
				got := delivered[ok]
				if len(got) != calls || !slices.IsSorted(got) {
					t.Errorf("ordering key %s: delivered %v, want %d in enqueue order", ok, got, calls)
				}
			}
			if !keys["call-3/1"] || len(keys) != 2*calls {
				t.Errorf("downstream keys %v", keys)
			}
			mu.Unlock()
			// The poisoned message dies after 3 attempts.
			var dead *idemcore.Message
			deadline := time.Now().Add(30 * time.Second) // a bound on a hang
			for dead == nil && time.Now().Before(deadline) {
				_ = a.Messages(func(m *idemcore.Message, err error) error {
					if err == nil && m.Dead {
						dead = m
					}
					return err
				})
				if dead == nil {
					time.Sleep(10 * time.Millisecond) // polls a state another goroutine reaches; no timing claim
				}
			}
			if dead == nil {
				t.Fatal("the poisoned message never died")
			}
			if dead.Failures != 3 || dead.LastError != "poison" || dead.DownstreamKey != "poisoned/0" {
				t.Fatalf("dead letter %+v", dead)
			}
			if err := b.DropDead(dead.Seq); err != nil {
				t.Fatal(err)
			}
			if err := b.DropDead(dead.Seq); !errors.Is(err, idemcore.ErrMessageNotFound) {
				t.Fatalf("second DropDead: %v", err)
			}
		})
	}
}

// TestDispatchParksATopicWithoutAHandler: a claimed message whose topic has
// no handler is parked, holding back its ordering key, while other keys'
// messages are delivered; Handle gives it back and it is delivered, then the
// message behind it. A second Dispatch fails with ErrDispatcherRunning; the
// first returns ctx.Err() when its ctx ends, and Dispatch after Close returns
// ErrClosed.
func TestDispatchParksATopicWithoutAHandler(t *testing.T) {
	st := newStore(t, pgtest.Env)
	e := st.open(t, &idemcore.Options{Outbox: idemcore.OutboxOptions{PollInterval: 20 * time.Millisecond}})
	ctx := context.Background()
	for key, topics := range map[string][]string{"a": {"late", "now"}, "b": {"now"}} {
		if _, err := e.DoTx(ctx, key, nil, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			for i, topic := range topics {
				if err := idempg.Enqueue(tx, topic, fmt.Appendf(nil, "%s%d", key, i)); err != nil {
					return nil, err
				}
			}
			return nil, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	got := make(chan string, 10)
	h := func(ctx context.Context, m idemcore.Message) error {
		got <- string(m.Payload)
		return nil
	}
	next := func() string {
		t.Helper()
		select {
		case p := <-got:
			return p
		case <-time.After(30 * time.Second): // a bound on a hang
			t.Fatal("no delivery")
			return ""
		}
	}
	e.Handle("now", h)
	dctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- e.Dispatch(dctx) }()
	if p := next(); p != "b0" {
		t.Fatalf("delivered %q first, want b0: a0 has no handler and holds a1 back", p)
	}
	if err := e.Dispatch(ctx); !errors.Is(err, idempg.ErrDispatcherRunning) {
		t.Fatalf("a second Dispatch: %v, want ErrDispatcherRunning", err)
	}
	e.Handle("late", h)
	if a, b := next(), next(); a != "a0" || b != "a1" {
		t.Fatalf("delivered %q, %q; want a0 then a1", a, b)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Dispatch after its ctx ended: %v", err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Dispatch(ctx); !errors.Is(err, idemcore.ErrClosed) {
		t.Fatalf("Dispatch after Close: %v, want ErrClosed", err)
	}
}
