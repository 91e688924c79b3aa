package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"

	"github.com/idemkit/idem/kit/taubench"
)

// A crash child of the taubench crash schedule is this program re-executed:
// it plays its part before anything else runs (in tests too).
func init() { taubench.ChildMain() }

func newTaubenchCmd(a *app) *cobra.Command {
	var (
		data, tasksFile string
		seed            uint64
		limit           int
		baseline        bool
		via             string
		on              = map[taubench.Schedule]*bool{}
	)
	c := &cobra.Command{
		Use:   "taubench",
		Short: "Play τ-bench retail agent traffic through idem under retries, duplicates and crashes",
		Long: `taubench plays the 115 tasks of τ-bench's retail domain (real agent tool calls
with reference outputs) against a fresh copy of the shop database, under each
fault schedule, once through idem (every write tool through DoTx, a key per
logical call, the canonical arguments as fingerprint) and once through a naive
baseline that calls the tools directly. It checks every answer the agent reads
against the reference, and the records each task changes against the task's.

The schedules (each a flag, all on by default):
  none        every call once: checks the tools themselves
  duplicate   every call sent twice in a row; the agent reads both answers
  lost        every call runs, its answer is dropped, the agent retries it
  concurrent  two identical calls in flight at the same moment
  crash       a child process is killed (SIGKILL) at a random point of one
              random write call; the file is reopened and the agent retries
  mutated     every write call is retried with the same key and changed
              arguments; idem must refuse it, the original's effect stands

The columns: tasks matching (every answer the agent read equals the reference
and the changed records equal the task's), outputs diverged (answers, counted
one by one), extra effects (write executions beyond one per logical call) and
state mismatches (tasks whose records differ). A retried write often leaves
the same records while answering differently, so a row can show extra effects
and diverged answers with no state mismatch.

With --via mcp, the 16 tools are served by an MCP server in a child process
over stdio (through idemmcp, write tools in the DoTx form, or without dedupe
for the baseline), every task is driven through a go-sdk client, and the
schedules act at the protocol: the same call sent again with the same key,
two in flight at once, the server's response dropped by the client's
transport (the call abandoned and retried with the same key), the server
SIGKILLed mid-call and restarted on the same file, and a retry with mutated
arguments. Extra effects are counted by the server, in the transaction of
each change.

The data is read from ../shared/taubench/retail beside the repository (or
--data DIR); it is not part of this repository. --db does not apply: every
task runs on a fresh copy in a temporary directory. The exit status is 1 if
any idem row falls short of every task.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if data == "" {
				data = taubench.DefaultDataDir(repoRoot())
			}
			dir, err := taubench.FindDataDir(data)
			if err != nil {
				return err
			}
			if tasksFile == "" {
				tasksFile = filepath.Join(dir, "tasks_test.jsonl")
			}
			tasks, err := taubench.LoadTasks(tasksFile)
			if err != nil {
				return err
			}
			if limit < 0 {
				return &usageError{fmt.Errorf("--limit must not be negative, not %d", limit)}
			}
			if len(tasks) == 0 {
				return fmt.Errorf("no tasks in %s", tasksFile)
			}
			if limit > 0 && limit < len(tasks) {
				tasks = tasks[:limit]
			}
			if !cmd.Flags().Changed("seed") {
				seed = uint64(time.Now().UnixNano())
			}
			var schedules []taubench.Schedule
			for _, s := range taubench.Schedules {
				if *on[s] {
					schedules = append(schedules, s)
				}
			}
			if len(schedules) == 0 {
				return &usageError{errors.New("every schedule is switched off")}
			}
			modes := 1
			if baseline {
				modes = 2
			}
			progress, finish := func(int, int) {}, func() {}
			if f, ok := a.stderr.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
				bar := progressbar.NewOptions(len(schedules)*modes*len(tasks),
					progressbar.OptionSetWriter(a.stderr),
					progressbar.OptionSetDescription("τ-bench"),
					progressbar.OptionShowCount(),
					progressbar.OptionSetPredictTime(true),
					progressbar.OptionClearOnFinish(),
					progressbar.OptionThrottle(100*time.Millisecond))
				progress = func(done, _ int) { _ = bar.Set(done) }
				finish = func() { _ = bar.Finish() }
			}
			run := taubench.Run
			switch via {
			case "direct":
			case "mcp":
				run = taubench.RunMCP
			default:
				return &usageError{fmt.Errorf("--via must be direct or mcp, not %q", via)}
			}
			rep, err := run(cmd.Context(), taubench.Config{
				DataDir: dir, Tasks: tasks, TasksFile: tasksFile, Schedules: schedules,
				Baseline: baseline, Seed: seed, Progress: progress,
			})
			finish()
			if err != nil {
				return err
			}
			if a.json {
				if err := a.printJSON(rep); err != nil {
					return err
				}
			} else {
				taubench.WriteTable(a.stdout, rep)
				fmt.Fprintf(a.stdout, "\nrepeat with: %s\n", repeatLine(cmd, rep.Seed))
			}
			if !rep.OK() {
				for _, row := range rep.Rows {
					if row.Mode != taubench.Idem {
						continue
					}
					for _, f := range row.Failures {
						fmt.Fprintf(a.stderr, "%s/%s: %s\n", row.Schedule, row.Mode, f)
					}
				}
				return &exitError{code: 1, msg: "idem: some idem rows fall short of the reference"}
			}
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&data, "data", "", "directory of τ-bench's retail data (default ../shared/taubench/retail beside the repository)")
	f.StringVar(&tasksFile, "tasks", "", "task file of the same format (default DATA/tasks_test.jsonl)")
	f.Uint64Var(&seed, "seed", 0, "seed of the random choices (default: from the clock, printed)")
	f.IntVar(&limit, "limit", 0, "play only the first N tasks")
	f.BoolVar(&baseline, "baseline", true, "also play every schedule without dedupe")
	f.StringVar(&via, "via", "direct", "how the agent reaches the tools: direct (in-process calls) or mcp (an MCP tool server in a child process over stdio, driven by a go-sdk client)")
	for _, s := range taubench.Schedules {
		on[s] = f.Bool(string(s), true, fmt.Sprintf("play the %s schedule", s))
	}
	return c
}

// repoRoot is the nearest directory from the working directory up whose
// go.mod is this module's: the repository root when run from inside it.
// Elsewhere it is the working directory.
func repoRoot() string {
	wd, err := os.Getwd()
	if err != nil {
		return "."
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil &&
			strings.HasPrefix(string(b), "module github.com/idemkit/idem\n") {
			return dir
		}
		if filepath.Dir(dir) == dir {
			return wd
		}
	}
}

// repeatLine is the command that repeats this run: its flags as given, and
// the seed it used.
func repeatLine(cmd *cobra.Command, seed uint64) string {
	line := []string{"idem taubench"}
	cmd.Flags().Visit(func(f *pflag.Flag) {
		if f.Name != "seed" {
			line = append(line, fmt.Sprintf("--%s=%s", f.Name, f.Value))
		}
	})
	return strings.Join(append(line, fmt.Sprintf("--seed=%d", seed)), " ")
}
