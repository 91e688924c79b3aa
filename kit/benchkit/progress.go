package benchkit

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// progress shows how a run goes: a bar on a terminal, a line per row on
// anything else (a log, a pipe), nothing without a writer.
type progress struct {
	bar      *progressbar.ProgressBar
	log      io.Writer
	n, total int
}

func newProgress(w io.Writer, total int) *progress {
	if !isTerminal(w) {
		return &progress{log: w, total: total}
	}
	return &progress{total: total, bar: progressbar.NewOptions(total,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetWidth(24),
		progressbar.OptionShowCount(),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionSetPredictTime(false),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionClearOnFinish(),
	)}
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// describe says what runs now.
func (p *progress) describe(s string) {
	if p.bar != nil {
		p.bar.Describe(s)
	}
}

// done counts a row.
func (p *progress) done(r Row) {
	p.n++
	switch {
	case p.bar != nil:
		_ = p.bar.Add(1)
	case p.log != nil:
		fmt.Fprintf(p.log, "[%d/%d] %s %s: %s\n", p.n, p.total, r.Workload, r.Contender, outcome(r))
	}
}

func (p *progress) finish() {
	if p.bar != nil {
		_ = p.bar.Finish()
	}
}

// outcome is a row's outcome in a few words.
func outcome(r Row) string {
	switch {
	case r.Skipped != "":
		return "skipped: " + r.Skipped
	case r.Error != "":
		return "failed: " + r.Error
	case r.OpsPerSec > 0:
		return fmt.Sprintf("%.0f ops/s", r.OpsPerSec)
	}
	return r.Note
}
