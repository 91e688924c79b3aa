package benchkit

import (
	"context"
	"fmt"
	"runtime"
)

// counts are what a throughput workload counts around its timed operations,
// beside their time, and reports per operation.
type counts uint8

// What a workload may count.
const (
	// countWrites counts the bytes written at the block device holding the
	// fixture's directory (metric "written-B/call"): every process's writes
	// to that device, so on a shared machine an upper bound.
	countWrites counts = 1 << iota
	// countAllocs counts the heap allocations of the whole process (metric
	// "allocs/call", from runtime.MemStats.Mallocs): Go allocations only, the
	// harness's included.
	countAllocs
)

// Units of the counted metrics.
const (
	writtenUnit = "written-B/call"
	allocsUnit  = "allocs/call"
)

// runCounted runs load like RunOps and adds what it asks to the result,
// per timed operation, as metrics and in its note ("20000 ops in 1.70s;
// 8.2 KiB written/call"). Bytes written are n/a when the fixture's device was
// not found.
func runCounted(ctx context.Context, f *Fixture, callers int, load Load, what counts, op Op) (*Result, error) {
	var (
		w0, w1         uint64
		w0ok, w1ok     bool
		allocs0, alloc uint64
	)
	r, err := runOps(ctx, callers, load, op, func() func() {
		if what&countAllocs != 0 {
			allocs0 = mallocs()
		}
		if what&countWrites != 0 {
			w0, w0ok = f.disk.written()
		}
		return func() {
			if what&countWrites != 0 {
				w1, w1ok = f.disk.written()
			}
			if what&countAllocs != 0 {
				alloc = mallocs() - allocs0
			}
		}
	})
	if err != nil {
		return nil, err
	}
	r.Note = fmt.Sprintf("%d ops in %.2fs", r.Ops, r.Elapsed.Seconds())
	ops := float64(max(r.Ops, 1))
	if what&countWrites != 0 {
		if w0ok && w1ok && w1 >= w0 {
			per := float64(w1-w0) / ops
			r.Metrics = append(r.Metrics, Metric{per, writtenUnit})
			r.Note += "; " + formatBytes(per) + " written/call"
		} else {
			r.Note += "; written/call n/a"
		}
	}
	if what&countAllocs != 0 {
		per := float64(alloc) / ops
		r.Metrics = append(r.Metrics, Metric{per, allocsUnit})
		r.Note += fmt.Sprintf("; %.1f allocs/call", per)
	}
	return r, nil
}

// mallocs is the number of heap objects the process allocated so far.
func mallocs() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.Mallocs
}

// formatBytes prints a byte count with a unit that suits it: "812 B",
// "8.2 KiB", "1.3 MiB".
func formatBytes(v float64) string {
	switch {
	case v >= 1<<20:
		return fmt.Sprintf("%.1f MiB", v/(1<<20))
	case v >= 1<<10:
		return fmt.Sprintf("%.1f KiB", v/(1<<10))
	}
	return fmt.Sprintf("%.0f B", v)
}
