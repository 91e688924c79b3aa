package bench_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/idemkit/idem/bench"
	"github.com/idemkit/idem/kit/benchkit"
)

// TestSyncsCounted counts the flushes per call of real contenders in a
// second process under strace. naive-bbolt's design is fixed (two bbolt
// commits per Do, one per DoTx, each two fdatasyncs), so its count must be 4
// and 2 per call, plus at most a few for Close, Open and Close; idem's must be
// at least the durable minimum, 2 per Do at one caller (started before fn,
// done before the answer) and 1 per DoTx, and the flushes per file (and
// the others) must add up to the total. Without strace it skips, and fails under CI.
func TestSyncsCounted(t *testing.T) {
	if _, err := exec.LookPath("strace"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("CI is set and strace is missing (.ci/run installs it)")
		}
		t.Skip("skipped: no strace")
	}
	const ops = 40
	for _, tc := range []struct {
		contender, kind string
		min, max        float64
	}{
		{"naive-bbolt", "first", 4, 4 + 8.0/ops},
		{"naive-bbolt", "dotx", 2, 2 + 8.0/ops},
		{"idem", "first", 2, 100},
		{"idem", "dotx", 1, 100},
	} {
		t.Run(tc.contender+"/"+tc.kind, func(t *testing.T) {
			var c benchkit.Contender
			for _, x := range bench.Contenders() {
				if x.Name == tc.contender {
					c = x
				}
			}
			f, err := benchkit.OpenFixture(context.Background(), c, t.TempDir(), benchkit.FixtureSpec{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			w := bench.SyncsWorkload(tc.kind, 50, ops, 2)
			r, err := w.Run(context.Background(), f, w.Load)
			if err != nil {
				t.Fatal(err)
			}
			total, _ := r.Metric("syncs/call")
			sum := 0.0
			for _, m := range r.Metrics {
				if strings.HasPrefix(m.Unit, "syncs/call:") || strings.HasPrefix(m.Unit, "flushes/call:") {
					sum += m.Value
				}
			}
			t.Logf("%s", r.Note)
			if r.Ops != ops || total < tc.min || total > tc.max || total != r.Score {
				t.Errorf("%d calls, %v syncs/call (score %v), want %d calls and %v to %v", r.Ops, total, r.Score, ops, tc.min, tc.max)
			}
			if d := sum - total; d > 1e-9 || d < -1e-9 {
				t.Errorf("per file %v, total %v", sum, total)
			}
		})
	}
}
