// Command compare runs every workload through idem and every baseline in one
// run, on the disk of the directory given, and prints a table side by side:
// ops/s, p50 and p99 latency, and each row's ratio to idem.
//
// Usage:
//
//	go run ./compare [--quick] [--only REGEXP] [--json] [--dir DIR]
//
// --only selects the rows whose "workload/contender" matches REGEXP, for
// example --only 'replay/keys=1e6' or --only '/(idem|postgres)$'. PostgreSQL
// rows need IDEM_BENCH_PG (scripts/postgres.sh start prints it); without it
// they say "skipped". A full run takes some 15 minutes; --quick, seconds.
//
// The progress bar goes to standard error, the table to standard output.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/idemkit/idem/bench"
)

// config is what the flags say.
type config struct {
	dir    string
	quick  bool
	only   *regexp.Regexp
	asJSON bool
	// bar draws a progress bar; otherwise each row is logged on a line of
	// its own as it completes (for logs that are not a terminal).
	bar bool
}

func main() {
	var (
		cfg  config
		only string
	)
	flag.StringVar(&cfg.dir, "dir", os.TempDir(), "directory on the disk to measure; the stores go in a temporary directory under it, removed afterwards")
	flag.BoolVar(&cfg.quick, "quick", false, "small sizes, for a smoke test: figures mean little")
	flag.StringVar(&only, "only", "", "run only the rows whose workload/contender matches this regular expression")
	flag.BoolVar(&cfg.asJSON, "json", false, "print the rows as JSON instead of a markdown table")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "compare: unexpected arguments %q\n", flag.Args())
		flag.Usage()
		os.Exit(2)
	}
	var err error
	if cfg.only, err = regexp.Compile(only); err != nil {
		fmt.Fprintf(os.Stderr, "compare: --only: %v\n", err)
		os.Exit(2)
	}

	cfg.bar = term.IsTerminal(int(os.Stderr.Fd()))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		os.Exit(1)
	}
}

// pair is one row to measure: workload index and contender index.
type pair struct{ w, c int }

func run(ctx context.Context, cfg config, stdout, stderr io.Writer) error {
	sizes := bench.FullSizes()
	if cfg.quick {
		sizes = bench.QuickSizes()
	}
	workloads, contenders := bench.Workloads(sizes), bench.Contenders()

	// Group the selected rows by fixture, in the order the workloads come.
	var (
		specs  []bench.FixtureSpec
		groups = map[bench.FixtureSpec][]int{}
		chosen = map[pair]bool{}
	)
	for wi, w := range workloads {
		for ci, c := range contenders {
			if !cfg.only.MatchString(w.Name + "/" + c.Name) {
				continue
			}
			chosen[pair{wi, ci}] = true
			if _, ok := groups[w.Fixture]; !ok {
				specs = append(specs, w.Fixture)
			}
			if g := groups[w.Fixture]; len(g) == 0 || g[len(g)-1] != wi {
				groups[w.Fixture] = append(g, wi)
			}
		}
	}
	if len(chosen) == 0 {
		return fmt.Errorf("--only %q matches no workload/contender", cfg.only)
	}

	root, err := os.MkdirTemp(cfg.dir, "idem-compare-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(root)

	bar := newProgress(cfg.bar, len(chosen), stderr)
	rows := map[pair]bench.Row{}
	for _, spec := range specs {
		for ci, c := range contenders {
			var sel []int
			for _, wi := range groups[spec] {
				if chosen[pair{wi, ci}] {
					sel = append(sel, wi)
				}
			}
			if len(sel) == 0 {
				continue
			}
			if err := ctx.Err(); err != nil {
				break
			}
			f, err := openFixture(ctx, bar, root, c, spec, workloads[sel[0]].Name)
			if err != nil {
				for _, wi := range sel {
					row := bench.NewRow(workloads[wi].Name, c.Name, nil, err)
					rows[pair{wi, ci}] = row
					bar.done(row)
				}
				continue
			}
			for _, wi := range sel {
				w := workloads[wi]
				bar.describe(fmt.Sprintf("%-32s %-13s", w.Name, c.Name))
				r, err := w.Run(ctx, f, w.Load)
				if ctx.Err() != nil {
					break
				}
				row := bench.NewRow(w.Name, c.Name, r, err)
				rows[pair{wi, ci}] = row
				bar.done(row)
			}
			if err := f.Close(); err != nil {
				fmt.Fprintf(stderr, "compare: closing %s: %v\n", c.Name, err)
			}
		}
	}
	bar.finish()

	var out []bench.Row
	for wi := range workloads {
		for ci := range contenders {
			if r, ok := rows[pair{wi, ci}]; ok {
				out = append(out, r)
			}
		}
	}
	bench.SetRatios(out)
	if cfg.asJSON {
		err = bench.WriteJSON(stdout, out)
	} else {
		fmt.Fprint(stdout, header(cfg))
		err = bench.WriteMarkdown(stdout, out)
	}
	return errors.Join(err, ctx.Err())
}

// openFixture opens c on spec in a directory of its own under root, telling
// the bar how the load goes.
func openFixture(ctx context.Context, bar *progress, root string, c bench.Contender, spec bench.FixtureSpec, first string) (*bench.Fixture, error) {
	dir, err := os.MkdirTemp(root, c.Name+"-")
	if err != nil {
		return nil, err
	}
	total := spec.Stored + spec.Expired
	desc := fmt.Sprintf("%-32s %-13s", first, c.Name)
	bar.describe(desc + " storing records")
	f, err := bench.OpenFixture(ctx, c, dir, spec, func(done int) {
		bar.describe(fmt.Sprintf("%s storing %d/%d records", desc, done, total))
	})
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return f, nil
}

// progress shows how the run goes: a bar on a terminal, a line per row
// elsewhere.
type progress struct {
	bar      *progressbar.ProgressBar
	log      io.Writer
	n, total int
}

func newProgress(bar bool, total int, w io.Writer) *progress {
	if !bar {
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

// describe says what runs now.
func (p *progress) describe(s string) {
	if p.bar != nil {
		p.bar.Describe(s)
	}
}

// done counts a row.
func (p *progress) done(r bench.Row) {
	p.n++
	if p.bar != nil {
		_ = p.bar.Add(1)
		return
	}
	status := outcome(r)
	fmt.Fprintf(p.log, "[%d/%d] %s %s: %s\n", p.n, p.total, r.Workload, r.Contender, status)
}

func (p *progress) finish() {
	if p.bar != nil {
		_ = p.bar.Finish()
	}
}

// outcome is a row's outcome in a few words.
func outcome(r bench.Row) string {
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

// header describes the run: command, machine, disk, sizes.
func header(cfg config) string {
	var b strings.Builder
	fmt.Fprintf(&b, "`go run ./compare %s` · %s\n\n", strings.Join(os.Args[1:], " "), time.Now().Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(&b, "- machine: %s/%s, %d CPUs (GOMAXPROCS %d)%s, %s\n",
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0), cpuModel(), runtime.Version())
	fmt.Fprintf(&b, "- disk: stores under %s\n", cfg.dir)
	sizes := "full"
	if cfg.quick {
		sizes = "quick (smoke test: figures mean little)"
	}
	fmt.Fprintf(&b, "- sizes: %s; 36-byte keys, 32-byte fingerprints, 200-byte responses, fn without I/O\n", sizes)
	pg := "skipped (" + bench.PostgresEnv + " not set)"
	if os.Getenv(bench.PostgresEnv) != "" {
		pg = "the server at " + bench.PostgresEnv
	}
	fmt.Fprintf(&b, "- postgres: %s\n\n", pg)
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
