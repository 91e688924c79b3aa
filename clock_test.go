package idem_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit"
	"github.com/idemkit/idem/internal/testkit/boltkit"
)

// One notion of time for the replay cache and the file: the clock seam strips
// Go's monotonic reading, so a record's times compare the same way whether
// they come from memory or from the file, and a wall-clock step cannot make
// the two disagree.
func TestClockTimesCarryNoMonotonicReading(t *testing.T) {
	clocks := map[string]func() time.Time{
		"default clock": nil,
		// A user's clock that passes time.Now's monotonic reading on.
		"clock with a monotonic reading": testkit.NewClock(time.Now()).Now,
	}
	for name, now := range clocks {
		t.Run(name, func(t *testing.T) {
			e, path := boltkit.Open(t, &idem.Options{Now: now})
			first, err := e.Do(bg, "k", nil, okFn("v"))
			require.NoError(t, err)
			cached, err := e.Do(bg, "k", nil, mustNotRun(t))
			require.NoError(t, err)
			require.True(t, cached.Replayed)
			stored, err := e.Get("k")
			require.NoError(t, err)
			for what, tm := range map[string]time.Time{
				"first answer's StartedAt": first.StartedAt, "first answer's CompletedAt": first.CompletedAt,
				"cached replay's StartedAt": cached.StartedAt, "cached replay's CompletedAt": cached.CompletedAt,
			} {
				require.Truef(t, tm == tm.Round(0), "%s carries a monotonic reading: %v", what, tm)
			}
			require.True(t, cached.StartedAt == stored.StartedAt && cached.CompletedAt == stored.CompletedAt,
				"cache %v/%v, file %v/%v", cached.StartedAt, cached.CompletedAt, stored.StartedAt, stored.CompletedAt)
			require.NoError(t, e.Close())

			e2, err := idem.Open(path, &idem.Options{Now: now})
			require.NoError(t, err)
			defer e2.Close()
			reopened, err := e2.Do(bg, "k", nil, mustNotRun(t))
			require.NoError(t, err)
			require.True(t, reopened.CompletedAt == cached.CompletedAt, "file after reopen %v, cache %v", reopened.CompletedAt, cached.CompletedAt)
		})
	}
}
