package benchkit

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Row is one line of the side-by-side table: one workload on one contender.
type Row struct {
	Workload  string `json:"workload"`
	Contender string `json:"contender"`
	// Ops and Seconds are the timed operations and their wall-clock time;
	// OpsPerSec is their quotient.
	Ops       int     `json:"ops,omitempty"`
	Seconds   float64 `json:"seconds,omitempty"`
	OpsPerSec float64 `json:"ops_per_sec,omitempty"`
	// P50us and P99us are latency quantiles in microseconds.
	P50us float64 `json:"p50_us,omitempty"`
	P99us float64 `json:"p99_us,omitempty"`
	// Score is what Ratio compares, in ScoreUnit (ops/s unless the workload
	// says otherwise).
	Score     float64 `json:"score,omitempty"`
	ScoreUnit string  `json:"score_unit,omitempty"`
	// Ratio is Score over the Score of RatioTo's row in the same workload.
	Ratio   float64 `json:"ratio,omitempty"`
	RatioTo string  `json:"ratio_to,omitempty"`
	// OfCeiling is, for the reference's first executions, OpsPerSec over the
	// ceiling the run's ceiling row measured (its "ceiling-Do/s").
	OfCeiling float64 `json:"of_ceiling,omitempty"`
	// OfFlushCeiling is, for the reference's rows at one caller, OpsPerSec
	// over what the run's flush ceiling row allows: its two-flush figure for
	// first executions, its one-flush figure for DoTx. FlushCeiling is that
	// figure, in calls per second.
	OfFlushCeiling float64            `json:"of_flush_ceiling,omitempty"`
	FlushCeiling   float64            `json:"flush_ceiling,omitempty"`
	Metrics        map[string]float64 `json:"metrics,omitempty"`
	Note           string             `json:"note,omitempty"`
	// Skipped says why the row was not measured; Error why it failed.
	Skipped string `json:"skipped,omitempty"`
	Error   string `json:"error,omitempty"`
}

// NewRow makes the row of workload on contender from what Run returned.
func NewRow(workload, contender string, r *Result, err error) Row {
	row := Row{Workload: workload, Contender: contender}
	switch {
	case errors.Is(err, ErrSkipped):
		row.Skipped = strings.TrimPrefix(err.Error(), ErrSkipped.Error()+": ")
		return row
	case err != nil:
		row.Error = err.Error()
		return row
	case r == nil:
		row.Error = "no result"
		return row
	}
	row.Ops, row.Seconds, row.OpsPerSec = r.Ops, r.Elapsed.Seconds(), r.OpsPerSec()
	if r.Latency != nil && r.Latency.Count() > 0 {
		row.P50us, row.P99us = us(r.Latency.Quantile(0.5)), us(r.Latency.Quantile(0.99))
	}
	row.Score, row.ScoreUnit, row.Note = r.Score, r.ScoreUnit, r.Note
	if len(r.Metrics) > 0 {
		row.Metrics = make(map[string]float64, len(r.Metrics))
		for _, m := range r.Metrics {
			row.Metrics[m.Unit] = m.Value
		}
	}
	return row
}

// SetRatios sets each measured row's Ratio to its Score over that of the
// Reference contender's row in the same workload, or, where the reference has
// no figure, of the Fallback contender's. The ceiling row has no ratio: it is
// bbolt's figure, not a contender's (nor have the flush and batch ceilings).
// When rows hold a ceiling row, it sets the OfCeiling of the Reference's
// first executions; when they hold a flush ceiling row, the OfFlushCeiling
// and FlushCeiling of its first/callers=1 and dotx/callers=1 rows.
func SetRatios(rows []Row) {
	refs := make(map[string]Row)
	var ceiling float64
	for _, name := range []string{Fallback, Reference} { // the reference wins
		for _, r := range rows {
			if r.Contender == name && r.Score > 0 {
				refs[r.Workload] = r
			}
		}
	}
	var flush Row
	for _, r := range rows {
		if v := r.Metrics[ceilingMetric]; v > 0 && strings.HasPrefix(r.Workload, ceilingPrefix) {
			ceiling = v
		}
		if strings.HasPrefix(r.Workload, flushCeilingName+"/") {
			flush = r
		}
	}
	for i := range rows {
		r := &rows[i]
		ref, ok := refs[r.Workload]
		if ok && r.Score > 0 && r.ScoreUnit == ref.ScoreUnit && !strings.HasPrefix(r.Workload, ceilingPrefix) {
			r.Ratio, r.RatioTo = r.Score/ref.Score, ref.Contender
		}
		if ceiling > 0 && r.Contender == Reference && strings.HasPrefix(r.Workload, "first/") && r.OpsPerSec > 0 {
			r.OfCeiling = r.OpsPerSec / ceiling
		}
		if r.Contender == Reference && r.OpsPerSec > 0 {
			fc := map[string]float64{"first/callers=1": flush.Metrics[twoFlushMetric], "dotx/callers=1": flush.Metrics[oneFlushMetric]}[r.Workload]
			if fc > 0 {
				r.OfFlushCeiling, r.FlushCeiling = r.OpsPerSec/fc, fc
			}
		}
	}
}

// WriteJSON writes rows as an indented JSON array.
func WriteJSON(w io.Writer, rows []Row) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rows)
}

// WriteMarkdown writes rows as a markdown table, with a legend.
func WriteMarkdown(w io.Writer, rows []Row) error {
	var b strings.Builder
	b.WriteString("| workload | contender | ops/s | p50 | p99 | ratio | notes |\n")
	b.WriteString("|---|---|--:|--:|--:|--:|---|\n")
	for _, r := range rows {
		ops, p50, p99, ratio, note := "", "", "", "", r.Note
		switch {
		case r.Skipped != "":
			ops, note = "skipped", r.Skipped
		case r.Error != "":
			ops, note = "failed", r.Error
		default:
			if r.OpsPerSec > 0 {
				ops = thousands(r.OpsPerSec)
			}
			if r.P50us > 0 || r.P99us > 0 {
				p50, p99 = formatUs(r.P50us), formatUs(r.P99us)
			}
			switch {
			case r.Ratio > 0 && r.RatioTo == r.Contender:
				ratio = "1 (ref)"
			case r.Ratio > 0:
				ratio = fmt.Sprintf("%.2f×", r.Ratio)
			}
			if note == "" && r.Ops > 0 {
				note = fmt.Sprintf("%d ops in %.2fs", r.Ops, r.Seconds)
			}
			if r.OfCeiling > 0 {
				note += fmt.Sprintf("; %.0f%% of the bbolt ceiling (%s Do/s)", 100*r.OfCeiling, thousands(r.OpsPerSec/r.OfCeiling))
			}
			if r.OfFlushCeiling > 0 {
				flushes := "two-flush"
				if strings.HasPrefix(r.Workload, "dotx/") {
					flushes = "one-flush"
				}
				note += fmt.Sprintf("; %.0f%% of the %s ceiling (%s/s)", 100*r.OfFlushCeiling, flushes, thousands(r.FlushCeiling))
			}
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s |\n",
			r.Workload, r.Contender, ops, p50, p99, ratio, cell(note))
	}
	b.WriteString(legend)
	_, err := io.WriteString(w, b.String())
	return err
}

// legend explains the table's columns.
const legend = `
ratio: the row's ops/s over idem's in the same workload; where idem has no figure, over
naive-bbolt's. bare's ratio is the overhead ratio: how much faster a plain call of fn is.
Memory rows compare disk bytes per record instead (lower is better). Prune rows: ops/s, p50
and p99 are the writers' from the prune's start until its end, or for as long as the idle
window if the prune was shorter. Latencies are per call, to within 1.6%.

ceiling: plain bbolt on the same disk (a file of its own beside naive-bbolt's, bbolt's
default options, the first rows' stored records): one caller commits durable transactions
of random-key puts with 200-byte values. Its ops are puts, its p50 and p99 are those of
whole transactions; half its puts/s is the ceiling of an engine that writes two records
per call, and idem's first rows give their ops/s as a fraction of it. ceiling/flush: the
disk itself: one caller appends 256 bytes to a preallocated, zero-filled file and
fdatasyncs it, in a loop; ops/s is flushes/s, half of it the two-flush ceiling of a Do
(started durable before fn, done before the answer), all of it the one-flush ceiling of a
DoTx, and idem's one-caller rows give their ops/s as a fraction of those.
ceiling/bbolt-batch: plain bbolt's group commit, one put per call through DB.Batch by the
many-caller rows' number of callers. dotx-seq: dotx with
the effect row keyed by a sequence number instead of the idempotency key, so that each
call adds one record at a random place in a B-tree instead of two.

written/call: bytes written to the block device that holds the stores (sectors written in
its /sys/block stat) while the timed calls ran, over the calls. It counts every process's
writes to that device, and this machine's other users write too: an upper bound, noisy on
a shared machine; PostgreSQL's server counts when its data directory is on that device.
allocs/call: heap allocations of the whole Go process (runtime.MemStats.Mallocs) while the
timed calls ran, over the calls, the harness's own included (bare's figure); Go objects
only, not what a database allocates outside Go's heap (SQLite's C heap, a server's).
`

// cell makes s safe in a markdown table cell: one line, no pipes, short.
func cell(s string) string {
	s = strings.ReplaceAll(strings.ReplaceAll(s, "\n", " "), "|", "/")
	if r := []rune(s); len(r) > 160 {
		s = string(r[:157]) + "…"
	}
	return s
}

// thousands formats v rounded, with thousands separators: "12,345".
func thousands(v float64) string {
	s := strconv.FormatInt(int64(v+0.5), 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// formatUs formats a latency in microseconds with a unit that suits it.
func formatUs(v float64) string {
	return FormatDuration(durationUs(v))
}

// Header describes a run, for the lines above its table: the command that
// made it and when, the machine, the disk the stores were on (dir) and the
// sizes (quick or full). Each of more adds a line, for example what a
// contender ran against.
func Header(command, dir string, quick bool, more ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "`%s` · %s\n\n", command, time.Now().Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(&b, "- machine: %s/%s, %d CPUs (GOMAXPROCS %d)%s, %s\n",
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0), cpuModel(), runtime.Version())
	fmt.Fprintf(&b, "- disk: stores under %s, on block device %s\n", dir, DiskDevice(dir))
	sizes := "full"
	if quick {
		sizes = "quick (smoke test: figures mean little)"
	}
	fmt.Fprintf(&b, "- sizes: %s; %d-byte keys, %d-byte fingerprints, %d-byte responses, fn without I/O\n",
		sizes, KeySize, FingerprintSize, ResponseSize)
	for _, m := range more {
		fmt.Fprintf(&b, "- %s\n", m)
	}
	b.WriteString("\n")
	return b.String()
}

// cpuModel is ", " and the CPU's model name on Linux, "" elsewhere.
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if k, v, ok := strings.Cut(s.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return ", " + strings.TrimSpace(v)
		}
	}
	return ""
}
