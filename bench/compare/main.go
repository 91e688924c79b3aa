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
// rows need IDEM_TEST_PG (../scripts/postgres.sh start prints it); without it
// they say "skipped". A full run takes some 9 minutes; --quick, seconds.
//
// The progress bar goes to standard error, the table to standard output.
// `idem bench` runs the same rows without the ones that need a database
// driver.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"slices"
	"strings"
	"syscall"

	"github.com/idemkit/idem/bench"
	"github.com/idemkit/idem/kit/benchkit"
)

// config is what the flags say.
type config struct {
	dir    string
	quick  bool
	only   *regexp.Regexp
	asJSON bool
}

func main() {
	bench.ChildMain() // a second process of the replay-2nd-process rows
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

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		os.Exit(1)
	}
}

// run measures the rows cfg selects, telling stderr how the run goes (a bar
// on a terminal), and prints the table to stdout, even when interrupted.
func run(ctx context.Context, cfg config, stdout, stderr io.Writer) error {
	sizes := benchkit.FullSizes()
	if cfg.quick {
		sizes = benchkit.QuickSizes()
	}
	plan, err := benchkit.NewPlan(bench.Workloads(sizes), bench.AllContenders(), cfg.only)
	if err != nil {
		return err
	}
	rows, runErr := plan.Run(ctx, cfg.dir, stderr)
	if cfg.asJSON {
		err = benchkit.WriteJSON(stdout, rows)
	} else {
		pg := "skipped (" + bench.PostgresEnv + " not set)"
		if os.Getenv(bench.PostgresEnv) != "" {
			pg = "the server at " + bench.PostgresEnv
		}
		command := strings.Join(append([]string{"go run ./compare"}, os.Args[1:]...), " ")
		fmt.Fprint(stdout, benchkit.Header(command, cfg.dir, cfg.quick, "postgres: "+pg))
		err = benchkit.WriteMarkdown(stdout, rows)
		if slices.ContainsFunc(rows, func(r benchkit.Row) bool { return strings.HasPrefix(r.Workload, "syncs/") }) {
			_, werr := io.WriteString(stdout, bench.SyncsLegend)
			err = errors.Join(err, werr)
		}
	}
	return errors.Join(runErr, err)
}
