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
	"go.etcd.io/bbolt"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit"
	"github.com/idemkit/idem/internal/testkit/boltkit"
)

// readerCalls is the number of calls made while a reader is held open:
// IDEM_READER_CALLS (the long run: 100000), else 5,000.
func readerCalls() int {
	if n, err := strconv.Atoi(os.Getenv("IDEM_READER_CALLS")); err == nil && n > 0 {
		return n
	}
	return 5000
}

// runBehindReader holds a read transaction (View) open while calls with new
// keys run from 16 goroutines, and releases it once the calls stop making
// progress (a commit that must remap the growing file waits for every
// reader) or all of them are done. It returns the calls done while the
// reader was held.
func runBehindReader(t *testing.T, e *idem.Engine, n int) (whileHeld int64) {
	var done atomic.Int64
	release := make(chan struct{})
	held := make(chan struct{})
	viewErr := make(chan error, 1)
	go func() {
		viewErr <- e.View(func(*bbolt.Tx) error {
			close(held)
			<-release
			return nil
		})
	}()
	<-held
	var wg sync.WaitGroup
	var next atomic.Int64
	for range 16 {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				if _, err := e.Do(bg, fmt.Sprintf("k%07d", i), nil, func(context.Context) ([]byte, error) { return []byte("response"), nil }); err != nil {
					t.Errorf("call %d: %v", i, err)
					return
				}
				done.Add(1)
			}
		})
	}
	// Release the reader when the count has not moved over 10 polls (half a
	// second without one call done), or at the end: the stall, if any, lasts
	// as long as the reader.
	last, still := int64(-1), 0
	for done.Load() < int64(n) && still < 10 {
		time.Sleep(50 * time.Millisecond)
		if d := done.Load(); d == last {
			still++
		} else {
			last, still = d, 0
		}
	}
	whileHeld = done.Load()
	close(release)
	require.NoError(t, <-viewErr)
	wg.Wait() // no deadlock: every call finishes once the reader ends
	require.EqualValues(t, n, done.Load())
	return whileHeld
}

// TestLongReader holds a read transaction open while 5,000 calls run
// (IDEM_READER_CALLS=100000 for the long run). With
// the default map, calls stall once the file outgrows it (the remap waits for
// the reader), and all of them finish once the reader ends: no deadlock, a
// stall bounded by the reader. With Options.InitialMmapSize above the file's
// final size, nothing stalls: every call finishes while the reader is still
// open. Afterwards, writing and pruning the same amount again does not grow
// the file: pages freed while the reader pinned them are reused once it ends.
func TestLongReader(t *testing.T) {
	for _, tc := range []struct {
		name string
		mmap int
		n    int
	}{
		{"default map", 0, readerCalls()},
		// Beside a reader, every commit rewrites a freelist that keeps
		// every page freed meanwhile: commits slow down as the reader ages,
		// so this case makes a fifth of the calls.
		{"InitialMmapSize 256 MiB", 256 << 20, readerCalls() / 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := tc.n
			clock := testkit.NewClock(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
			e, path := boltkit.OpenFile(t, &idem.BoltOptions{InitialMmapSize: tc.mmap, NoSync: true}, &idem.Options{PruneInterval: -1, ReplayCacheBytes: -1,
				Now: clock.Now, Retention: time.Hour})
			held := runBehindReader(t, e, n)
			t.Logf("%s: %d of %d calls done while the reader was held", tc.name, held, n)
			if tc.mmap > 0 {
				require.EqualValues(t, n, held, "a map larger than the file: no stall behind the reader")
			}
			size := func() int64 { fi, err := os.Stat(path); require.NoError(t, err); return fi.Size() }
			// Steady state: expire, prune, write the same amount again.
			var sizes []int64
			for round := range 3 {
				clock.Advance(3 * time.Hour)
				_, err := e.Prune(bg)
				require.NoError(t, err)
				for i := range n / 2 {
					_, err := e.Do(bg, fmt.Sprintf("r%d-%07d", round, i), nil, func(context.Context) ([]byte, error) { return []byte("response"), nil })
					require.NoError(t, err)
				}
				sizes = append(sizes, size())
			}
			t.Logf("file sizes after each prune-and-write round: %v", sizes)
			require.Equal(t, sizes[1], sizes[2], "the file stops growing once the reader has closed")
		})
	}
}
