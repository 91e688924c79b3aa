package idem_test

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit"
	"github.com/idemkit/idem/internal/testkit/boltkit"
)

// TestMaxSizeBoundsTheFile fills a file bounded by Options.MaxSize with new
// keys, as one principal minting unique keys would: the call that does not fit
// fails with ErrFileFull (and bbolt's ErrMaxSizeReached), the file stays
// under the bound, every answer given before replays, and once the records
// expire and are pruned the freed pages take new calls again.
func TestMaxSizeBoundsTheFile(t *testing.T) {
	const maxSize = 1 << 20
	clock := testkit.NewClock(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	e, path := boltkit.OpenFile(t, &idem.BoltOptions{MaxSize: maxSize}, &idem.Options{Now: clock.Now, PruneInterval: -1, Retention: time.Hour, ReplayCacheBytes: -1})
	resp := make([]byte, 2000)
	var ran atomic.Int64
	fn := func(context.Context) ([]byte, error) { ran.Add(1); return resp, nil }
	acked := 0
	var err error
	for i := range 10000 {
		if _, err = e.Do(bg, fmt.Sprintf("k%05d", i), nil, fn); err != nil {
			break
		}
		acked++
	}
	require.ErrorIs(t, err, idem.ErrFileFull)
	require.ErrorIs(t, err, bolterrors.ErrMaxSizeReached)
	require.Greater(t, acked, 100, "the file took calls before it was full")
	fi, statErr := os.Stat(path)
	require.NoError(t, statErr)
	require.LessOrEqual(t, fi.Size(), int64(maxSize))

	for i := range acked {
		res, err := e.Do(bg, fmt.Sprintf("k%05d", i), nil, mustNotRun(t))
		require.NoError(t, err, "an answer given before the file filled up replays")
		require.True(t, res.Replayed)
	}
	for i := 0; err == nil && i < 10000; i++ {
		_, err = e.Do(bg, fmt.Sprintf("more-%05d", i), nil, fn)
	}
	require.ErrorIs(t, err, idem.ErrFileFull, "the engine did not fail closed: it goes on refusing what does not fit")

	clock.Advance(3 * time.Hour)
	n, err := e.Prune(bg)
	require.NoError(t, err, "pruning a full file works")
	require.GreaterOrEqual(t, n, acked)
	for i := range 100 {
		_, err := e.Do(bg, fmt.Sprintf("after-%d", i), nil, fn)
		require.NoError(t, err, "pruned pages take new calls")
	}
	fi, statErr = os.Stat(path)
	require.NoError(t, statErr)
	require.LessOrEqual(t, fi.Size(), int64(maxSize))
}
