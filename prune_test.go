package idem_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit"
	"github.com/idemkit/idem/internal/testkit/boltkit"
)

func TestRetentionWithFakeClock(t *testing.T) {
	clock := testkit.NewClock(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	e, _ := boltkit.Open(t, &idem.Options{Now: clock.Now, PruneInterval: -1})
	_, err := e.Do(bg, "k", []byte("a"), okFn("first"))
	require.NoError(t, err)

	clock.Advance(idem.DefaultRetention - time.Nanosecond)
	res, err := e.Do(bg, "k", []byte("a"), mustNotRun(t))
	require.NoError(t, err)
	require.True(t, res.Replayed, "inside the window: replayed")

	clock.Advance(time.Nanosecond)
	_, err = e.Get("k")
	require.ErrorIs(t, err, idem.ErrNotFound, "expired at the window's end, before any prune")
	st, err := e.ScanFile()
	require.NoError(t, err)
	require.Equal(t, 1, st.ExpiredPending)
	require.Zero(t, st.Done)

	// Slots are dropped whole once every record in them expired: at most one
	// slot width (the retention window) later.
	clock.Advance(idem.DefaultRetention)
	n, err := e.Prune(bg)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	st, err = e.ScanFile()
	require.NoError(t, err)
	require.Zero(t, st.ExpiredPending)
	require.EqualValues(t, 1, e.Stats().Pruned)

	res, err = e.Do(bg, "k", []byte("another request"), okFn("second"))
	require.NoError(t, err, "the key is new afterwards")
	require.False(t, res.Replayed)
	require.Equal(t, "second", string(res.Response))
}

func TestPruneNeverDropsALiveRecord(t *testing.T) {
	clock := testkit.NewClock(time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC))
	e, _ := boltkit.Open(t, &idem.Options{Now: clock.Now, PruneInterval: -1, Retention: time.Hour})
	// One record every minute for three hours; prune every minute.
	for i := range 180 {
		_, err := e.Do(bg, fmt.Sprintf("k%d", i), nil, okFn("v"))
		require.NoError(t, err)
		_, err = e.Prune(bg)
		require.NoError(t, err)
		// Every record of the last hour is still there.
		for j := max(0, i-59); j <= i; j++ {
			_, err := e.Get(fmt.Sprintf("k%d", j))
			require.NoError(t, err, "record %d pruned at minute %d", j, i)
		}
		clock.Advance(time.Minute)
	}
	st, err := e.ScanFile()
	require.NoError(t, err)
	require.Equal(t, 59, st.Done, "the clock ended a minute after the last call: minutes 121-179 are live")
	require.Positive(t, e.Stats().Pruned)
	require.LessOrEqual(t, st.ExpiredPending, 61, "reclaimed within one slot width (60 records) of expiring, plus the minute since the last prune")
}

func TestPruneExpiresInterruptedExecutions(t *testing.T) {
	clock := testkit.NewClock(time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC))

	t.Run("re-execute policy: expire a window after they started", func(t *testing.T) {
		e, _ := boltkit.Open(t, &idem.Options{Now: clock.Now, PruneInterval: -1})
		_, _ = interrupt(e, "k", []byte("a"))
		clock.Advance(idem.DefaultRetention)
		_, err := e.Get("k")
		require.ErrorIs(t, err, idem.ErrNotFound, "expired at once")
		clock.Advance(idem.DefaultRetention) // its slot, one window wide, is past too
		n, err := e.Prune(bg)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		res, err := e.Do(bg, "k", []byte("b"), okFn("v"))
		require.NoError(t, err)
		require.Equal(t, 1, res.Attempt, "a new key, not a recovery")
	})
	t.Run("refuse policy: stay until resolved", func(t *testing.T) {
		e, _ := boltkit.Open(t, &idem.Options{Now: clock.Now, PruneInterval: -1, Recovery: idem.RecoverRefuse})
		_, _ = interrupt(e, "k", []byte("a"))
		clock.Advance(10 * idem.DefaultRetention)
		n, err := e.Prune(bg)
		require.NoError(t, err)
		require.Zero(t, n)
		_, err = e.Do(bg, "k", []byte("a"), mustNotRun(t))
		require.ErrorIs(t, err, idem.ErrIncomplete)
	})
}

func TestBackgroundPrunerRunsAndStopsOnClose(t *testing.T) {
	clock := testkit.NewClock(time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC))
	e, _ := boltkit.Open(t, &idem.Options{Now: clock.Now, PruneInterval: time.Millisecond, Retention: time.Minute})
	_, err := e.Do(bg, "k", nil, okFn("v"))
	require.NoError(t, err)
	clock.Advance(3 * time.Minute)
	require.Eventually(t, func() bool {
		return e.Stats().Pruned == 1
	}, 10*time.Second, time.Millisecond)
	require.NoError(t, e.Close()) // goleak in TestMain checks that it stopped
}

// TestConcurrentPrunesTakeTurns: prunes that overlap take turns (prune holds
// pruneMu), so each expired record is pruned once: the counts of four
// prunes started together add up to the records that expired, round after
// round. Without the turns they add up to four times as many.
func TestConcurrentPrunesTakeTurns(t *testing.T) {
	clock := testkit.NewClock(time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC))
	e, _ := boltkit.OpenFile(t, &idem.BoltOptions{NoSync: true}, &idem.Options{Now: clock.Now, PruneInterval: -1, Retention: time.Minute})
	const rounds, perRound, prunes = 20, 20, 4
	for round := range rounds {
		for i := range perRound {
			_, err := e.Do(bg, fmt.Sprintf("r%d-%d", round, i), nil, okFn("v"))
			require.NoError(t, err)
		}
		clock.Advance(3 * time.Minute)
		type pruned struct {
			n   int
			err error
		}
		results := make(chan pruned, prunes)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for range prunes {
			wg.Go(func() {
				<-start
				n, err := e.Prune(bg)
				results <- pruned{n, err}
			})
		}
		close(start)
		wg.Wait()
		close(results)
		sum := 0
		for r := range results {
			require.NoError(t, r.err, "overlapping prunes must not fail")
			sum += r.n
		}
		// Had two prunes counted or deleted the same slot, the counts would
		// add up to more than the records that expired, or one would fail.
		require.Equal(t, perRound, sum, "round %d: each expired record is pruned by exactly one prune", round)
	}
	s, err := e.ScanFile()
	require.NoError(t, err)
	require.EqualValues(t, rounds*perRound, e.Stats().Pruned)
	require.Zero(t, s.Done+s.Started+s.ExpiredPending)
}

// Slots carry their own span: a file made under one retention window reads
// right under another, and new slots take the new width.
func TestRetentionChangeBetweenOpens(t *testing.T) {
	clock := testkit.NewClock(time.Date(2026, 11, 30, 12, 0, 30, 0, time.UTC))
	path := filepath.Join(t.TempDir(), "idem.db")
	e, err := idem.Open(path, &idem.Options{Now: clock.Now, Retention: time.Minute, PruneInterval: -1})
	require.NoError(t, err)
	_, err = e.Do(bg, "done", nil, okFn("v"))
	require.NoError(t, err)
	_, err = interrupt(e, "interrupted", nil)
	require.ErrorIs(t, err, context.Canceled)
	require.NoError(t, e.Close())

	clock.Advance(45 * time.Second)
	e, err = idem.Open(path, &idem.Options{Now: clock.Now, Retention: 24 * time.Hour, PruneInterval: -1})
	require.NoError(t, err)
	defer e.Close()
	res, err := e.Do(bg, "done", nil, mustNotRun(t))
	require.NoError(t, err)
	require.True(t, res.Replayed, "a record of a one-minute slot is found under a 24-hour window")
	res, err = e.Do(bg, "interrupted", nil, okFn("recovered"))
	require.NoError(t, err)
	require.Equal(t, 2, res.Attempt)
	st, err := e.ScanFile()
	require.NoError(t, err)
	require.Equal(t, 2, st.Done, "the recovered key kept one version")
	require.Zero(t, st.Started)

	// A day later, the one-minute slots are long past and dropped; the record
	// completed under the new window is still there until its own day ends.
	clock.Advance(23 * time.Hour)
	_, err = e.Prune(bg)
	require.NoError(t, err)
	_, err = e.Get("interrupted")
	require.NoError(t, err)
}
