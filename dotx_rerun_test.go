package idem_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit/boltkit"
)

// No DoTx fn runs more than 3 times per call, whatever fails around it
// (DESIGN.md, "DoTx and group commit"): 200 concurrent calls sharing commits,
// of which some fail.
func TestDoTxReRunsAreBounded(t *testing.T) {
	const callers = 200
	cases := map[string]func(i int, failures int64) bool{
		"20 permanent failures": func(i int, _ int64) bool { return i%10 == 9 },
		// Each re-run exposes a new failure: the call that fails next
		// depends on how many failed before it.
		"each re-run exposes a new failure": func(i int, failures int64) bool { return i >= callers-20 && int64(callers-1-i) == failures },
	}
	for name, fails := range cases {
		t.Run(name, func(t *testing.T) {
			e, _ := boltkit.OpenFile(t, &idem.BoltOptions{NoSync: true}, nil)
			errFail := errors.New("fn failed")
			maxRuns, rolledBack := 0, false
			for round := 0; round < 10 && !rolledBack; round++ {
				// instrumentation only: a DoTx fn must not share memory
				var failures atomic.Int64
				runs := make([]atomic.Int64, callers)

				shareCommits(t, e, fmt.Sprintf("r%d-blocker", round), callers, func(i int) {
					key := fmt.Sprintf("r%d-k%03d", round, i)
					res, err := e.DoTx(bg, key, nil, func(_ context.Context, tx *idem.Tx) ([]byte, error) {
						runs[i].Add(1)
						b, err := tx.Bucket([]byte("data"))
						if err != nil {
							return nil, err
						}
						if err := b.Put([]byte(key), []byte("written")); err != nil {
							return nil, err
						}
						if fails(i, failures.Load()) {
							failures.Add(1)
							return nil, errFail
						}
						return []byte(key), nil
					})
					if err != nil && !errors.Is(err, errFail) {
						t.Errorf("%s: %v", key, err)
					} else if err == nil && string(res.Response) != key {
						t.Errorf("%s: got %q", key, res.Response)
					}
				})

				total := 0
				for i := range callers {
					r := int(runs[i].Load())
					total += r
					maxRuns = max(maxRuns, r)
					require.LessOrEqual(t, r, 3, "call %d's fn ran %d times", i, r)
				}
				rolledBack = total > callers
				t.Logf("round %d: %d fn runs for %d calls, %d failures, at most %d runs of one fn", round, total, callers, failures.Load(), maxRuns)
			}
			require.True(t, rolledBack, "no shared commit was rolled back and re-run in 10 rounds")
		})
	}
}
