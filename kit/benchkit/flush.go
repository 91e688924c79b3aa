package benchkit

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Metrics of the flush ceiling: what one flush per call, and two, allow.
const (
	flushesMetric       = "flushes/s"
	twoFlushMetric      = "two-flush-ceiling-Do/s"
	oneFlushMetric      = "one-flush-ceiling-DoTx/s"
	flushCeilingName    = ceilingPrefix + "flush"
	flushAppendSize     = 256
	flushPreallocChunks = 1 << 20
)

// FlushCeilingWorkload measures the disk's flush rate, the physical limit of
// any durable engine on it: one caller appends 256 bytes to a file and
// flushes it (fdatasync on Linux, fsync elsewhere), in a loop, one flush per
// operation. The file is preallocated and zero-filled (and synced) before
// the timed loop, in the fixture's directory, so that no append grows it (a
// file growing under appends syncs its metadata too). It runs on the
// naive-bbolt contender only, as the bbolt ceiling does: its figure is the
// disk's, not a contender's.
//
// ops/s is flushes per second; the metrics "two-flush-ceiling-Do/s" (half
// of it: a Do that must flush its started record before fn and its done
// record before answering) and "one-flush-ceiling-DoTx/s" (all of it) are
// what SetRatios compares idem's one-caller rows to.
func FlushCeilingWorkload(stored int, load Load) Workload {
	return Workload{
		Name:       fmt.Sprintf("%s/append=%dB", flushCeilingName, flushAppendSize),
		Fixture:    FixtureSpec{Stored: stored},
		Callers:    1,
		Load:       load,
		Bytes:      flushAppendSize,
		Contenders: []string{Fallback},
		Run: func(ctx context.Context, f *Fixture, load Load) (*Result, error) {
			if f.D.Name() != Fallback {
				return nil, fmt.Errorf("%w: the flush ceiling is measured on %s's row", ErrSkipped, Fallback)
			}
			return runFlushCeiling(ctx, f, load)
		},
	}
}

func runFlushCeiling(ctx context.Context, f *Fixture, load Load) (res *Result, err error) {
	path := filepath.Join(f.Dir, "flush.log")
	file, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("flush ceiling: %w", err)
	}
	defer func() {
		err = errors.Join(err, file.Close(), os.Remove(path))
	}()
	appends := max(load.Ops, 1) + load.Warmup
	zeros := make([]byte, flushPreallocChunks)
	for off := 0; off < appends*flushAppendSize; off += len(zeros) {
		if _, err := file.Write(zeros); err != nil {
			return nil, fmt.Errorf("flush ceiling: preallocating: %w", err)
		}
	}
	if err := file.Sync(); err != nil {
		return nil, fmt.Errorf("flush ceiling: %w", err)
	}
	rec := make([]byte, flushAppendSize)
	copy(rec, response)
	r, err := runCounted(ctx, f, 1, load, countWrites, func(_ context.Context, i int) error {
		if _, err := file.WriteAt(rec, int64(i)*flushAppendSize); err != nil {
			return err
		}
		return fdatasync(file)
	})
	if err != nil {
		return nil, fmt.Errorf("flush ceiling: %w", err)
	}
	flushes := r.OpsPerSec()
	r.Metrics = append(r.Metrics, Metric{flushes, flushesMetric}, Metric{flushes / 2, twoFlushMetric}, Metric{flushes, oneFlushMetric})
	r.Note = fmt.Sprintf("%d appends of %d B, each flushed, in %.2fs on a preallocated file: two-flush ceiling %s Do/s, one-flush %s DoTx/s",
		r.Ops, flushAppendSize, r.Elapsed.Seconds(), thousands(flushes/2), thousands(flushes))
	return r, nil
}
