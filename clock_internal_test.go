package idem

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemcore"
)

// jumpClock is a clock for Options.Now that tests move both ways.
type jumpClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *jumpClock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *jumpClock) Set(t time.Time) { c.mu.Lock(); c.now = t; c.mu.Unlock() }

// TestClockJumps moves the engine clock back by hours and forward past the
// retention window: nothing expires before its completion time plus the
// window, everything expires and is pruned once the clock passes that, and
// Prune's work after a jump of ten years is bounded by the slots it drops
// (its commits are counted), not by the time jumped.
func TestClockJumps(t *testing.T) {
	ctx := context.Background()
	const ret = time.Hour
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	clock := &jumpClock{now: t0}
	e, err := OpenFile(t.TempDir()+"/idem.db", &BoltOptions{NoSync: true}, &Options{Now: clock.Now, Retention: ret, PruneInterval: -1, ReplayCacheBytes: -1})
	require.NoError(t, err)
	defer e.Close()
	ok := func(context.Context) ([]byte, error) { return []byte("v"), nil }
	live := func(key string) bool {
		_, err := e.Get(key)
		if errors.Is(err, ErrNotFound) {
			return false
		}
		require.NoError(t, err)
		return true
	}
	commits := func() uint64 { c, _ := e.b.pipe.Stats(); return c }

	_, err = e.Do(ctx, "before", nil, ok)
	require.NoError(t, err)
	clock.Set(t0.Add(-6 * time.Hour)) // backward by hours
	require.True(t, live("before"), "a backward jump expires nothing")
	_, err = e.Do(ctx, "during", nil, ok) // completes at t0-6h
	require.NoError(t, err)
	c := commits()
	n, err := e.Prune(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "nothing is pruned early")
	require.Equal(t, c, commits(), "and Prune commits nothing")

	clock.Set(t0.Add(ret - time.Nanosecond))
	require.True(t, live("before"), "live until its completion plus the window")
	require.False(t, live("during"), "expired by the engine clock it completed by")
	clock.Set(t0.Add(ret))
	require.False(t, live("before"))

	for i := range 100 { // records in many slots, then a jump of ten years
		clock.Set(t0.Add(time.Duration(i) * ret / 10))
		_, err = e.Do(ctx, fmt.Sprintf("k%d", i), nil, ok)
		require.NoError(t, err)
	}
	slots := len(e.b.st.knownSlots())
	clock.Set(t0.Add(10 * 365 * 24 * time.Hour))
	c = commits()
	n, err = e.Prune(ctx)
	require.NoError(t, err)
	require.Equal(t, 102, n, "everything is pruned: nothing lives forever")
	require.LessOrEqual(t, commits()-c, uint64(slots), "one commit per slot dropped, whatever the jump")
	st, err := e.ScanFile()
	require.NoError(t, err)
	require.Zero(t, st.Done+st.Started+st.ExpiredPending)

	clock.Set(t0.Add(-24 * time.Hour)) // and back again: a new key works
	res, err := e.Do(ctx, "before", nil, ok)
	require.NoError(t, err)
	require.False(t, res.Replayed)
}

// TestDispatcherClockJumps: a message waiting for its backoff while the
// clock jumps back by five hours does not make the dispatcher spin: it sleeps
// at most PollInterval a pass (its passes are counted over 200 ms of real
// time), and once the clock passes the message's next attempt it is
// delivered.
func TestDispatcherClockJumps(t *testing.T) {
	ctx := context.Background()
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	clock := &jumpClock{now: t0}
	const poll = 10 * time.Millisecond
	attempts := make(chan int, 10)
	handler := func(ctx context.Context, m Message) error {
		attempts <- m.Attempt
		if m.Attempt == 1 {
			return errors.New("down")
		}
		return nil
	}
	claims := &claimCounter{}
	e, err := open(t.TempDir()+"/idem.db", &BoltOptions{NoSync: true}, &Options{Now: clock.Now, PruneInterval: -1, Outbox: OutboxOptions{Dispatch: true, BaseBackoff: time.Hour, MaxBackoff: time.Hour, PollInterval: poll,
		Handlers: map[string]Handler{"t": handler}}},
		func(b idemcore.Backend[*Tx]) idemcore.Backend[*Tx] { claims.Backend = b; return claims })
	require.NoError(t, err)
	defer e.Close()
	_, err = e.DoTx(ctx, "k", nil, func(_ context.Context, tx *Tx) ([]byte, error) { return nil, tx.Enqueue("t", nil) })
	require.NoError(t, err)
	require.Equal(t, 1, <-attempts)

	clock.Set(t0.Add(-5 * time.Hour)) // the retry is now 6 hours away
	before := claims.n.Load()
	time.Sleep(200 * time.Millisecond)
	passes := claims.n.Load() - before
	t.Logf("dispatcher passes in 200ms with the clock 5h back: %d", passes)
	require.LessOrEqual(t, passes, uint64(200*time.Millisecond/poll)+10, "no busy loop: at most one pass per PollInterval, plus wakeups")
	select {
	case a := <-attempts:
		t.Fatalf("attempt %d before its backoff ended", a)
	default:
	}

	clock.Set(t0.Add(2 * time.Hour)) // past the backoff (at most an hour after t0)
	select {
	case a := <-attempts:
		require.Equal(t, 2, a)
	case <-time.After(10 * time.Second):
		t.Fatal("the message was not delivered once its backoff passed")
	}
}

// claimCounter counts the dispatcher's ClaimDue calls: one per pass of its
// loop while a worker is free.
type claimCounter struct {
	idemcore.Backend[*Tx]
	n atomic.Uint64
}

func (c *claimCounter) ClaimDue(ctx context.Context, now time.Time, limit int) (idemcore.Due, error) {
	c.n.Add(1)
	return c.Backend.ClaimDue(ctx, now, limit)
}
