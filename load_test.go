package idem_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit"
	"github.com/idemkit/idem/internal/testkit/boltkit"
)

// TestLoadTenThousandCallersOneKey: 10,000 goroutines call one key at once
// (fsync on): fn runs once, and every caller gets its response.
func TestLoadTenThousandCallersOneKey(t *testing.T) {
	e, _ := boltkit.Open(t, nil)
	var ran atomic.Int64
	var wg sync.WaitGroup
	answers := make([]string, 10000)
	errs := make([]error, 10000)
	for i := range answers {
		wg.Go(func() {
			res, err := e.Do(bg, "one", nil, func(context.Context) ([]byte, error) {
				ran.Add(1)
				time.Sleep(10 * time.Millisecond) // the others pile up behind it
				return []byte("the answer"), nil
			})
			answers[i], errs[i] = string(res.Response), err
		})
	}
	wg.Wait()
	require.EqualValues(t, 1, ran.Load())
	for i := range answers {
		require.NoError(t, errs[i])
		require.Equal(t, "the answer", answers[i])
	}
}

// TestLoadTenThousandKeys: 10,000 goroutines, each on a key of its own,
// fsync on: every fn runs once and every record is done.
func TestLoadTenThousandKeys(t *testing.T) {
	e, _ := boltkit.Open(t, nil)
	var ran atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, 10000)
	for i := range errs {
		wg.Go(func() {
			_, errs[i] = e.Do(bg, fmt.Sprintf("k%05d", i), nil, func(context.Context) ([]byte, error) {
				ran.Add(1)
				return []byte("v"), nil
			})
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.EqualValues(t, 10000, ran.Load())
	st, err := e.ScanFile()
	require.NoError(t, err)
	require.Equal(t, 10000, st.Done)
}

// TestLoadRetentionCompressed writes records for three days of engine clock
// (24-hour retention) with eight writers, pruning every 30 minutes of that
// clock, and checks at every prune that no record younger than the window
// was pruned (a sample of the newest stays live) and that the file holds at
// most two windows of records (retention is a floor, a slot wide); at the
// end, a jump past the window prunes everything. The CI slice writes 5,000
// records; IDEM_LOAD_RECORDS=1000000 is the long run (ROBUSTNESS.md).
func TestLoadRetentionCompressed(t *testing.T) {
	total := 5000
	if n, err := strconv.Atoi(os.Getenv("IDEM_LOAD_RECORDS")); err == nil && n > 0 {
		total = n
	}
	const ret = 24 * time.Hour
	const span = 3 * ret
	start := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	clock := testkit.NewClock(start)
	e, path := boltkit.OpenFile(t, &idem.BoltOptions{NoSync: true}, &idem.Options{Now: clock.Now, Retention: ret, PruneInterval: -1, ReplayCacheBytes: -1})
	step := span / time.Duration(total)
	perPrune := int(30 * time.Minute / step)
	if perPrune < 1 {
		perPrune = 1
	}
	written, pruned, maxSize := 0, 0, int64(0)
	var sizeAfterDay1 int64
	for written < total {
		batch := min(perPrune, total-written)
		var wg sync.WaitGroup
		errs := make(chan error, batch)
		for w := range 8 {
			wg.Go(func() {
				for i := w; i < batch; i += 8 {
					_, err := e.Do(bg, fmt.Sprintf("k%07d", written+i), nil, func(context.Context) ([]byte, error) { return []byte("response"), nil })
					if err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		written += batch
		clock.Advance(time.Duration(batch) * step)
		n, err := e.Prune(bg)
		require.NoError(t, err)
		pruned += n
		// The newest records are live, and the file holds at most two windows.
		for _, k := range []int{written - 1, written - batch} {
			_, err := e.Get(fmt.Sprintf("k%07d", k))
			require.NoError(t, err, "a record inside its window was pruned")
		}
		require.LessOrEqual(t, written-pruned, int(2*ret/step)+2*perPrune+8, "more than two windows of records are kept")
		fi, err := os.Stat(path)
		require.NoError(t, err)
		maxSize = max(maxSize, fi.Size())
		if sizeAfterDay1 == 0 && time.Duration(written)*step >= 2*ret {
			sizeAfterDay1 = fi.Size()
		}
	}
	clock.Advance(2 * ret)
	n, err := e.Prune(bg)
	require.NoError(t, err)
	pruned += n
	require.Equal(t, written, pruned, "every record is pruned once the window has passed: nothing lives forever")
	fi, err := os.Stat(path)
	require.NoError(t, err)
	t.Logf("records written and pruned: %d over %v of engine clock; file %d bytes at two days, %d at most, %d at the end",
		written, span, sizeAfterDay1, maxSize, fi.Size())
}
