package main

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"

	"github.com/spf13/cobra"

	"github.com/idemkit/idem/kit/benchkit"
)

func newBenchCmd(a *app) *cobra.Command {
	var (
		dir   string
		quick bool
		only  string
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure idem side by side with a bare call and a naive bbolt engine",
		Long: `bench measures idem on this machine's disk, side by side with a bare call of
fn (the overhead ratio) and a naive bbolt engine (one Update for the started
record, one for the done record): first executions with 1 to 256 callers, DoTx,
replays of recent and cold keys, fingerprint conflicts, bytes per record, and
pruning while writers run, beside the ceiling of plain bbolt on this disk
(transactions of 1,000 random-key puts). It prints a markdown table of ops/s,
p50 and p99 latency, and each row's ratio to idem (--json: the rows as JSON);
its notes give the bytes each write call wrote at the block device holding
--dir (every process's writes count), and the heap allocations of each replay.

Every store is durable (fsync on every commit) and lives in a temporary
directory under --dir, removed afterwards. It opens no existing file: --db,
--retention and --recovery do not apply. A full run stores 1e6 records and takes
minutes; --quick, seconds (its figures mean little). The progress bar goes to
stderr. Disks of shared machines drift by tens of percent over minutes: compare
figures from one run only.

The rows of SQLite and PostgreSQL need database drivers, which this tool does
not carry: in a checkout of idem, run cd bench && go run ./compare.`,
		Example: `  idem bench --quick
  idem bench --only 'first/callers=(1|64)/'
  idem bench --dir /var/lib/app --only '/(idem|naive-bbolt)$'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			re, err := regexp.Compile(only)
			if err != nil {
				return &usageError{fmt.Errorf("--only: %w", err)}
			}
			command := "idem bench"
			if cmd.Flags().Changed("dir") {
				command += " --dir " + shellQuote(dir)
			}
			if quick {
				command += " --quick"
			}
			if only != "" {
				command += " --only " + shellQuote(only)
			}
			return a.bench(cmd.Context(), dir, quick, re, command)
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", os.TempDir(), "directory on the disk to measure; the stores go in a temporary directory under it")
	f.BoolVar(&quick, "quick", false, "small sizes, for a smoke test: figures mean little")
	f.StringVar(&only, "only", "", "run only the rows whose workload/contender matches this regular expression, for example 'replay/keys=1e6' or '/idem$'")
	return cmd
}

func (a *app) bench(ctx context.Context, dir string, quick bool, only *regexp.Regexp, command string) error {
	sizes := benchkit.FullSizes()
	if quick {
		sizes = benchkit.QuickSizes()
	}
	plan, err := benchkit.NewPlan(benchkit.Workloads(sizes), benchkit.Contenders(), only)
	if err != nil {
		return &usageError{err}
	}
	rows, runErr := plan.Run(ctx, dir, a.stderr)
	interrupted := runErr != nil && ctx.Err() != nil
	if a.json {
		err = benchkit.WriteJSON(a.stdout, rows)
	} else {
		fmt.Fprint(a.stdout, benchkit.Header(command, dir, quick))
		err = benchkit.WriteMarkdown(a.stdout, rows)
	}
	switch {
	case err != nil:
		return err
	case interrupted:
		return &exitError{code: 1, msg: "idem: bench interrupted; the table holds the rows measured before"}
	case runErr != nil:
		return fmt.Errorf("bench: %w", runErr)
	}
	return nil
}

// shellQuote quotes s for a POSIX shell when it needs quoting.
func shellQuote(s string) string {
	if s != "" && !strings.ContainsFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./=:,+@%", r))
	}) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
