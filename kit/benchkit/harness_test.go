package benchkit_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/kit/benchkit"
	"github.com/idemkit/idem/kit/benchkit/benchtest"
)

func TestKey(t *testing.T) {
	uuid := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	seen := make(map[string]bool)
	for i := range 100_000 {
		k := benchkit.Key(i)
		if len(k) != benchkit.KeySize || !uuid.MatchString(k) {
			t.Fatalf("Key(%d) = %q: not a %d-byte UUID", i, k, benchkit.KeySize)
		}
		if seen[k] {
			t.Fatalf("Key(%d) = %q: seen before", i, k)
		}
		seen[k] = true
	}
	if a, b := benchkit.Key(7), benchkit.Key(7); a != b {
		t.Error("Key is not deterministic")
	}
}

func TestFingerprint(t *testing.T) {
	a, b := benchkit.Fingerprint(3), benchkit.OtherFingerprint(3)
	if len(a) != benchkit.FingerprintSize || len(b) != benchkit.FingerprintSize {
		t.Fatalf("fingerprint sizes %d, %d; want %d", len(a), len(b), benchkit.FingerprintSize)
	}
	if bytes.Equal(a, b) || !bytes.Equal(a, benchkit.Fingerprint(3)) || bytes.Equal(a, benchkit.Fingerprint(4)) {
		t.Error("fingerprints must be deterministic, and differ across keys and from OtherFingerprint")
	}
}

func TestCount(t *testing.T) {
	for n, want := range map[int]string{1000: "1e3", 10_000: "1e4", 100_000: "1e5", 1_000_000: "1e6", 2000: "2000", 64: "64", 10: "10", 0: "0"} {
		if got := benchkit.Count(n); got != want {
			t.Errorf("Count(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestHistogram(t *testing.T) {
	var h, a, b benchkit.Histogram
	if h.Quantile(0.5) != 0 || h.Count() != 0 {
		t.Fatal("an empty histogram must answer zero")
	}
	// 1 µs … 100 ms, uniformly on a log scale, split over two histograms.
	const n = 10_000
	vals := make([]time.Duration, n)
	for i := range vals {
		vals[i] = time.Duration(1000 * math.Pow(1e5, float64(i)/(n-1)))
		if i%2 == 0 {
			a.Record(vals[i])
		} else {
			b.Record(vals[i])
		}
	}
	h.Merge(&a)
	h.Merge(&b)
	if h.Count() != n || h.Max() != vals[n-1] {
		t.Fatalf("count %d, max %v; want %d, %v", h.Count(), h.Max(), n, vals[n-1])
	}
	for _, q := range []float64{0, 0.01, 0.5, 0.9, 0.99, 0.999, 1} {
		want := vals[max(int(math.Ceil(q*n))-1, 0)]
		got := h.Quantile(q)
		if rel := math.Abs(float64(got-want)) / float64(want); rel > 1.0/64 {
			t.Errorf("Quantile(%v) = %v, want %v (off by %.1f%%)", q, got, want, 100*rel)
		}
	}
	var small benchkit.Histogram
	small.Record(3)
	small.Record(-5) // counts as zero
	if small.Quantile(1) != 3 || small.Quantile(0.5) != 0 {
		t.Errorf("small values must be exact: got %v, %v", small.Quantile(0.5), small.Quantile(1))
	}
}

func TestRunOps(t *testing.T) {
	ctx := context.Background()
	t.Run("each operation once", func(t *testing.T) {
		var seen [1100]atomic.Int32
		r, err := benchkit.RunOps(ctx, 8, benchkit.Load{Ops: 1000, Warmup: 100}, func(_ context.Context, i int) error {
			seen[i].Add(1)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if r.Ops != 1000 || r.Latency.Count() != 1000 || r.OpsPerSec() <= 0 {
			t.Errorf("ops %d, latencies %d, ops/s %v; want 1000, 1000, > 0", r.Ops, r.Latency.Count(), r.OpsPerSec())
		}
		for i := range seen {
			if seen[i].Load() != 1 {
				t.Fatalf("operation %d ran %d times", i, seen[i].Load())
			}
		}
	})
	t.Run("first error stops", func(t *testing.T) {
		const callers = 4
		boom := errors.New("boom")
		var ran atomic.Int32
		_, err := benchkit.RunOps(ctx, callers, benchkit.Load{Ops: 1_000_000}, func(ctx context.Context, i int) error {
			ran.Add(1)
			switch {
			case i == 10:
				return boom
			case i > 10:
				// Taken before the error stopped the run: RunOps cancels
				// ctx, which must end the operations in flight.
				select {
				case <-ctx.Done():
				case <-time.After(10 * time.Second):
					t.Errorf("operation %d: ctx not cancelled after the error", i)
				}
			}
			return nil
		})
		if !errors.Is(err, boom) || !strings.Contains(err.Error(), "operation 10") {
			t.Errorf("err = %v, want boom at operation 10", err)
		}
		// Operations 0 … 10, and at most one more per other caller.
		if n := ran.Load(); n > 11+callers-1 {
			t.Errorf("%d operations ran; want at most %d", n, 11+callers-1)
		}
	})
	t.Run("max duration", func(t *testing.T) {
		r, err := benchkit.RunOps(ctx, 2, benchkit.Load{Ops: 1 << 30, Max: 20 * time.Millisecond}, func(context.Context, int) error {
			time.Sleep(time.Millisecond)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if r.Elapsed > time.Second || r.Ops == 0 {
			t.Errorf("ran %d ops in %v; want a stop after about 20ms", r.Ops, r.Elapsed)
		}
	})
}

func TestReport(t *testing.T) {
	res := func(ops int) *benchkit.Result {
		var h benchkit.Histogram
		h.Record(100 * time.Microsecond)
		return &benchkit.Result{Ops: ops, Elapsed: time.Second, Latency: &h, Score: float64(ops), ScoreUnit: "ops/s"}
	}
	rows := []benchkit.Row{
		benchkit.NewRow("first", "idem", res(2000), nil),
		benchkit.NewRow("first", "postgres", nil, errors.Join(benchkit.ErrSkipped, errors.New("no server"))),
		benchkit.NewRow("first", "sqlite-full", res(1000), nil),
		benchkit.NewRow("replay", "naive-bbolt", res(400), nil),
		benchkit.NewRow("replay", "bare", res(4000), nil),
		benchkit.NewRow("replay", "idem", nil, errors.New("broken\nengine")),
	}
	benchkit.SetRatios(rows)
	if rows[2].Ratio != 0.5 || rows[2].RatioTo != "idem" {
		t.Errorf("sqlite ratio %v to %q, want 0.5 to idem", rows[2].Ratio, rows[2].RatioTo)
	}
	if rows[4].Ratio != 10 || rows[4].RatioTo != "naive-bbolt" {
		t.Errorf("bare ratio %v to %q, want 10 to the fallback naive-bbolt", rows[4].Ratio, rows[4].RatioTo)
	}
	var b strings.Builder
	if err := benchkit.WriteMarkdown(&b, rows); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| first | idem | 2,000 | 100µs | 100µs | 1 (ref) |",
		"| first | postgres | skipped |",
		"| first | sqlite-full | 1,000 | 100µs | 100µs | 0.50× |",
		"| replay | idem | failed |  |  |  | broken engine |",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}

func TestContenders(t *testing.T) {
	for _, c := range benchkit.Contenders() {
		t.Run(c.Name, func(t *testing.T) {
			t.Run("dedupe", func(t *testing.T) { benchtest.Dedupe(t, c) })
			t.Run("workloads", func(t *testing.T) { benchtest.Workloads(t, c, benchtest.TinySizes()) })
		})
	}
}

func TestPlan(t *testing.T) {
	ws, cs := benchkit.Workloads(benchtest.TinySizes()), benchkit.Contenders()
	t.Run("only matching no row", func(t *testing.T) {
		if _, err := benchkit.NewPlan(ws, cs, regexp.MustCompile(`^nothing$`)); err == nil {
			t.Error("NewPlan accepted an --only that matches no row")
		}
	})
	t.Run("rows in table order", func(t *testing.T) {
		// Two workloads of one fixture, and one of another, on two contenders.
		p, err := benchkit.NewPlan(ws, cs, regexp.MustCompile(`^(first/callers=1|replay/keys=200/cold/callers=4|conflict/keys=200)/(idem|naive-bbolt)$`))
		if err != nil {
			t.Fatal(err)
		}
		if p.Len() != 6 {
			t.Fatalf("Len() = %d, want 6", p.Len())
		}
		dir := t.TempDir()
		var log strings.Builder
		rows, err := p.Run(context.Background(), dir, &log)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, r := range rows {
			if r.Error != "" || r.Skipped != "" || r.OpsPerSec <= 0 {
				t.Errorf("%s/%s: %+v", r.Workload, r.Contender, r)
			}
			if r.Contender == "idem" && r.Ratio != 1 {
				t.Errorf("%s/idem: ratio %v, want 1", r.Workload, r.Ratio)
			}
			got = append(got, r.Workload+"/"+r.Contender)
		}
		want := []string{
			"first/callers=1/idem", "first/callers=1/naive-bbolt",
			"replay/keys=200/cold/callers=4/idem", "replay/keys=200/cold/callers=4/naive-bbolt",
			"conflict/keys=200/idem", "conflict/keys=200/naive-bbolt",
		}
		if !slices.Equal(got, want) {
			t.Errorf("rows %q, want %q", got, want)
		}
		if n := strings.Count(log.String(), "\n"); n != 6 || !strings.Contains(log.String(), "[6/6] ") {
			t.Errorf("progress: %d lines, want one per row:\n%s", n, log.String())
		}
		if left, _ := os.ReadDir(dir); len(left) != 0 {
			t.Errorf("the run left %d entries in its directory", len(left))
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		p, err := benchkit.NewPlan(ws, cs, regexp.MustCompile(`^first/`))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		rows, err := p.Run(ctx, t.TempDir(), nil)
		if !errors.Is(err, context.Canceled) || len(rows) != 0 {
			t.Errorf("%d rows, err %v; want none and context.Canceled", len(rows), err)
		}
	})
}

func TestHeader(t *testing.T) {
	h := benchkit.Header("idem bench --quick", "/mnt/disk", true, "postgres: skipped")
	for _, want := range []string{"`idem bench --quick` · ", "- machine: ", "- disk: stores under /mnt/disk, on block device ", "- sizes: quick", "- postgres: skipped\n"} {
		if !strings.Contains(h, want) {
			t.Errorf("header lacks %q:\n%s", want, h)
		}
	}
}

func TestCeiling(t *testing.T) {
	s := benchtest.TinySizes()
	ws := benchkit.Workloads(s)
	p, err := benchkit.NewPlan(ws, benchkit.Contenders(), regexp.MustCompile(`^(first/callers=8|ceiling/puts.*)/`))
	if err != nil {
		t.Fatal(err)
	}
	// first/callers=8 on three contenders; the ceiling on naive-bbolt only.
	if p.Len() != 4 {
		t.Fatalf("Len() = %d, want 4", p.Len())
	}
	rows, err := p.Run(context.Background(), t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var ceiling, first benchkit.Row
	for _, r := range rows {
		if r.Error != "" || r.Skipped != "" {
			t.Fatalf("%s/%s: %+v", r.Workload, r.Contender, r)
		}
		switch {
		case strings.HasPrefix(r.Workload, "ceiling/"):
			ceiling = r
		case r.Contender == "idem":
			first = r
		}
	}
	if ceiling.Workload != "ceiling/puts-per-tx=100" || ceiling.Contender != "naive-bbolt" || ceiling.Ops != 200 || ceiling.Ratio != 0 {
		t.Errorf("ceiling row %+v; want 2 transactions of 100 puts by naive-bbolt, no ratio", ceiling)
	}
	do := ceiling.Metrics["ceiling-Do/s"]
	if do <= 0 || math.Abs(do-ceiling.OpsPerSec/2) > 1e-6*do {
		t.Errorf("ceiling %v Do/s, want half of %v puts/s", do, ceiling.OpsPerSec)
	}
	if want := first.OpsPerSec / do; first.OfCeiling <= 0 || math.Abs(first.OfCeiling-want) > 1e-9 {
		t.Errorf("idem's first row: %v of the ceiling, want %v", first.OfCeiling, want)
	}
	var b strings.Builder
	if err := benchkit.WriteMarkdown(&b, rows); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "% of the bbolt ceiling (") {
		t.Errorf("table lacks the fraction of the ceiling:\n%s", b.String())
	}
}

// TestFlushCeiling: the flush ceiling and the batch ceiling are naive-bbolt's
// rows only, without ratios; the flush ceiling's two figures are half its
// flushes/s and all of it, and idem's first/callers=1 and dotx/callers=1
// rows give their ops/s as a fraction of them, in the table too.
func TestFlushCeiling(t *testing.T) {
	s := benchtest.TinySizes()
	s.DoTxCallers = []int{1, 4}
	p, err := benchkit.NewPlan(benchkit.Workloads(s), benchkit.Contenders(), regexp.MustCompile(`^(first/callers=1|dotx/callers=1|ceiling/(flush|bbolt-batch).*)/(idem|naive-bbolt)$`))
	if err != nil {
		t.Fatal(err)
	}
	if p.Len() != 6 {
		t.Fatalf("Len() = %d, want 6: two rows each of first and dotx, a flush and a batch ceiling", p.Len())
	}
	rows, err := p.Run(context.Background(), t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]benchkit.Row{}
	for _, r := range rows {
		if r.Error != "" || r.Skipped != "" {
			t.Fatalf("%s/%s: %+v", r.Workload, r.Contender, r)
		}
		got[r.Workload+"/"+r.Contender] = r
	}
	flush, batch := got["ceiling/flush/append=256B/naive-bbolt"], got["ceiling/bbolt-batch/callers=4/naive-bbolt"]
	if flush.Ops == 0 || flush.Ratio != 0 || batch.Ops == 0 || batch.Ratio != 0 {
		t.Fatalf("flush ceiling %+v, batch ceiling %+v: want measured rows of naive-bbolt without ratios", flush, batch)
	}
	if f := flush.Metrics["flushes/s"]; f != flush.OpsPerSec || flush.Metrics["two-flush-ceiling-Do/s"] != f/2 || flush.Metrics["one-flush-ceiling-DoTx/s"] != f {
		t.Errorf("flush ceiling metrics %v, ops/s %v", flush.Metrics, flush.OpsPerSec)
	}
	for w, fc := range map[string]float64{"first/callers=1/idem": flush.OpsPerSec / 2, "dotx/callers=1/idem": flush.OpsPerSec} {
		r := got[w]
		if want := r.OpsPerSec / fc; r.FlushCeiling != fc || math.Abs(r.OfFlushCeiling-want) > 1e-9 {
			t.Errorf("%s: %v of the flush ceiling %v, want %v of %v", w, r.OfFlushCeiling, r.FlushCeiling, want, fc)
		}
	}
	if r := got["first/callers=1/naive-bbolt"]; r.OfFlushCeiling != 0 {
		t.Errorf("naive-bbolt's first row has a fraction of the flush ceiling: %+v", r)
	}
	var b strings.Builder
	if err := benchkit.WriteMarkdown(&b, rows); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"% of the two-flush ceiling (", "% of the one-flush ceiling (", "| ceiling/flush/append=256B | naive-bbolt |"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}

func TestCounted(t *testing.T) {
	s := benchtest.TinySizes()
	p, err := benchkit.NewPlan(benchkit.Workloads(s), benchkit.Contenders(), regexp.MustCompile(`^(first/callers=1|dotx-seq/callers=4|replay/keys=200/cold/callers=4)/(idem|naive-bbolt)$`))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	deviceFound := !strings.HasPrefix(benchkit.DiskDevice(dir), "not found")
	rows, err := p.Run(context.Background(), dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 6 {
		t.Fatalf("%d rows, want 6", len(rows))
	}
	for _, r := range rows {
		written, hasWritten := r.Metrics["written-B/call"]
		allocs, hasAllocs := r.Metrics["allocs/call"]
		switch {
		case strings.HasPrefix(r.Workload, "replay/"):
			if !hasAllocs || allocs <= 0 || hasWritten || !strings.Contains(r.Note, " allocs/call") {
				t.Errorf("%s/%s: metrics %v, note %q; want allocs/call only", r.Workload, r.Contender, r.Metrics, r.Note)
			}
		case deviceFound:
			// A durable commit writes at least a 4 KiB page, and one is
			// shared by at most the row's callers (a journal's group).
			callers := 1
			if _, after, ok := strings.Cut(r.Workload, "callers="); ok {
				callers, _ = strconv.Atoi(after)
			}
			if min := 4096 / float64(callers); !hasWritten || written < min || hasAllocs || !strings.Contains(r.Note, " written/call") {
				t.Errorf("%s/%s: metrics %v, note %q; want at least %.0f B written/call", r.Workload, r.Contender, r.Metrics, r.Note, min)
			}
		default:
			if hasWritten || !strings.Contains(r.Note, "written/call n/a") {
				t.Errorf("%s/%s: metrics %v, note %q; want written/call n/a", r.Workload, r.Contender, r.Metrics, r.Note)
			}
		}
		if !strings.HasPrefix(r.Note, fmt.Sprintf("%d ops in ", r.Ops)) {
			t.Errorf("%s/%s: note %q does not start with the ops", r.Workload, r.Contender, r.Note)
		}
	}
}
