package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"

	"github.com/idemkit/idem/kit/taubench"
)

// newTaubenchChildCmd is the hidden subcommand a crash child of the taubench
// crash schedule runs: the runner re-executes this program with
// taubench.ChildCommand and a spec as its arguments. Only that argument makes
// a crash child, never the environment.
func newTaubenchChildCmd(*app) *cobra.Command {
	return hiddenChildCmd(taubench.ChildCommand+" SPEC", "A crash child of idem taubench (internal)", func(spec string) error {
		if err := taubench.RunChild(spec); err != nil {
			return err
		}
		return errors.New("taubench child: the crash point was not reached")
	})
}

// newTaubenchMCPServerChildCmd is the hidden subcommand the MCP tool server
// child of `idem taubench --via mcp` runs: the runner re-executes this program
// with taubench.MCPServerChildCommand and a configuration as its arguments.
func newTaubenchMCPServerChildCmd(*app) *cobra.Command {
	return hiddenChildCmd(taubench.MCPServerChildCommand+" CONFIG",
		"The MCP tool server child of idem taubench --via mcp (internal)", taubench.RunMCPServerChild)
}

// hiddenChildCmd is a hidden subcommand of one argument, which run gets.
func hiddenChildCmd(use, short string, run func(arg string) error) *cobra.Command {
	return &cobra.Command{
		Use:    use,
		Short:  short,
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE:   func(_ *cobra.Command, args []string) error { return run(args[0]) },
	}
}

func newTaubenchCmd(a *app) *cobra.Command {
	var (
		data, tasksFile string
		seed            uint64
		limit           int
		baseline        bool
		via             string
		backend, pg     string
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

With --via mcp-proxy, the idem rows play the same through idem mcp-proxy (this
program, with a generated configuration protecting the 7 write tools, the key
from _meta, and marking the 9 others read-only; a file of its own per task)
in front of the same tool server without idem; the baseline rows, the server
without idem and no proxy. Under the crash schedule the proxy restarts the
killed server and re-executes the call with "io.github.idemkit/recovered": true
in its _meta (the server is not killed again), and the agent reads that answer.
A server without idem killed after its commit runs the call again then: the
effect happens twice, or the tool meets its own effect and answers an error (a
cancelled order cannot be cancelled again). This is the proxy's limit in front
of a server that does not reconcile by the key it is sent, and the table
counts it in columns of its own (recovered calls, recovered diverged,
recovered effects), outside outputs diverged and extra effects; a task with a
divergent recovered answer is not matching. Every other count of an idem row
must be zero.

With --backend postgres, each task's database lives in a schema of its own
(taubench_…, dropped after the task), and idem's records in one per row of
the table, on the Postgres server --pg names (a pgx DSN; default $IDEM_PG, else $IDEM_TEST_PG): the
retail tools read and write Postgres tables, every write call goes through
idempg (DoTx's fn writing through its pgx.Tx), and the children get the DSN
in their environment. The crash schedule then also draws the form of the
crashed call: DoTx (a kill before the commit leaves nothing, the server rolls
back) or Do, where the tool commits in a transaction of its own inside fn
together with its answer under the key, and the child is killed before or
after that commit holding the key's claim. This program, a second process,
then waits out the claim's lease (1 s), takes the key over (fn sees
Recovered) and answers the recorded answer or runs the tool; the report
counts these takeovers. With --via mcp-proxy the proxy keeps its own records
in a bbolt file; the tool server behind it uses Postgres.

The data (τ-bench's retail domain: orders.json, users.json, products.json
and tasks_test.jsonl) is third-party data, not part of this repository. It is
looked for, in order, in:
  --data DIR            if given, only there
  $IDEM_TAUBENCH_DATA   if set, only there
  ../shared/taubench/retail beside the idem checkout that holds the working
                        directory (or beside the working directory)
  ../shared/taubench/retail beside the idem checkout this program was built
                        from (go install ./cmd/idem from a checkout)
When none of the last two holds it, taubench plays its built-in sample
instead, and says so in one line on stderr: a small retail world of idem's
own (generated, nothing of τ-bench's data) over the same 16 tools, with 24
tasks written for it whose reference outputs come from a fault-free run of
the tools (kit/taubench/sample), under the same schedules and modes.
With --json, the report is one JSON document: via (direct, mcp or
mcp-proxy), backend, sample, seed, and a row per schedule and mode, each with
its counts, over MCP the server its calls reached (idemmcp, plain: without
idem, or mcp-proxy) and for an idem row where its records were (records:
bbolt for the proxy's file, whatever the backend of the tool server's tables),
and for a crash row its kill points (crashes: task, action, point, and the
process killed: crash-child, or the tool-server).

--db does not apply: every task runs on a fresh copy in a temporary
directory. Progress goes to stderr: a bar on a terminal, else a line per
finished row. The exit status is 1 if any idem row falls short of every task
(for --via mcp-proxy: other than by the answers of recovered calls).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// The flags first: a usage error finds no data.
			if limit < 0 {
				return &usageError{fmt.Errorf("--limit must not be negative, not %d", limit)}
			}
			if !slices.Contains([]string{"direct", "mcp", "mcp-proxy"}, via) {
				return &usageError{fmt.Errorf("--via must be direct, mcp or mcp-proxy, not %q", via)}
			}
			switch taubench.Backend(backend) {
			case taubench.Bolt:
				pg = ""
			case taubench.Postgres:
				if !cmd.Flags().Changed("pg") {
					pg = cmp.Or(a.getenv("IDEM_PG"), a.getenv("IDEM_TEST_PG"))
				}
				if pg == "" {
					return &usageError{errors.New("--backend postgres needs --pg DSN (or $IDEM_PG or $IDEM_TEST_PG)")}
				}
			default:
				return &usageError{fmt.Errorf("--backend must be bbolt or postgres, not %q", backend)}
			}
			dir, sample, cleanup, err := a.retailData(data)
			if err != nil {
				return err
			}
			defer cleanup()
			if tasksFile == "" {
				tasksFile = filepath.Join(dir, taubench.TasksFile)
			}
			tasks, err := taubench.LoadTasks(tasksFile)
			if err != nil {
				return err
			}
			if sample {
				fmt.Fprintln(a.stderr, sampleNotice(len(tasks)))
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
			progress, finish := rowProgress(a.stderr, schedules, baseline, len(tasks)), func() {}
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
			case "mcp-proxy":
				dir, err := os.MkdirTemp("", "idem-taubench-proxy-")
				if err != nil {
					return err
				}
				defer os.RemoveAll(dir)
				opts, err := proxyOptions(dir)
				if err != nil {
					return err
				}
				run = func(ctx context.Context, cfg taubench.Config) (*taubench.Report, error) {
					return taubench.RunMCPWith(ctx, cfg, opts)
				}
			default:
				return &usageError{fmt.Errorf("--via must be direct, mcp or mcp-proxy, not %q", via)}
			}
			rep, err := run(cmd.Context(), taubench.Config{
				DataDir: dir, Sample: sample, Tasks: tasks, TasksFile: tasksFile, Schedules: schedules,
				Baseline: baseline, Seed: seed, Progress: progress,
				Backend: taubench.Backend(backend), PG: pg,
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
	f.StringVar(&data, "data", "", "directory of τ-bench's retail data (default: $IDEM_TAUBENCH_DATA, else ../shared/taubench/retail beside the checkout; see above)")
	f.StringVar(&tasksFile, "tasks", "", "task file of the same format (default DATA/tasks_test.jsonl)")
	f.Uint64Var(&seed, "seed", 0, "seed of the random choices (default: from the clock, printed)")
	f.IntVar(&limit, "limit", 0, "play only the first N tasks")
	f.BoolVar(&baseline, "baseline", true, "also play every schedule without dedupe")
	f.StringVar(&via, "via", "direct", "how the agent reaches the tools: direct (in-process calls), mcp (an MCP tool server in a child process over stdio, driven by a go-sdk client) or mcp-proxy (the same client, through idem mcp-proxy in front of the tool server without idem)")
	f.StringVar(&backend, "backend", string(taubench.Bolt), "where the task databases and idem's records live: bbolt (a file per task) or postgres (a schema per task on --pg)")
	f.StringVar(&pg, "pg", "", "the Postgres server of --backend postgres, a pgx DSN (default $IDEM_PG, else $IDEM_TEST_PG)")
	for _, s := range taubench.Schedules {
		on[s] = f.Bool(string(s), true, fmt.Sprintf("play the %s schedule", s))
	}
	c.AddCommand(newTaubenchServeCmd(a))
	return c
}

// proxyOptions are the MCP runner's options of --via mcp-proxy: the idem
// rows' tool server is the one without idem (ServeConfig.Idem false) behind
// `idem mcp-proxy` (this program, re-executed), with a configuration, written
// to dir, that protects the write tools with the key from _meta (refusing a
// call without one) and marks the read tools read-only; each task's proxy
// records in its own file beside the task's. The baseline rows' server is the
// same server without the proxy.
func proxyOptions(dir string) (taubench.MCPOptions, error) {
	type tool struct {
		ReadOnly bool `json:"readOnly,omitempty"`
	}
	cfg := struct {
		Tools      map[string]tool `json:"tools"`
		MissingKey string          `json:"missingKey"`
	}{Tools: map[string]tool{}, MissingKey: "refuse"}
	for _, t := range taubench.Tools() {
		cfg.Tools[t.Name] = tool{ReadOnly: !t.Write}
	}
	raw, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return taubench.MCPOptions{}, err
	}
	config := filepath.Join(dir, "proxy.json")
	if err := os.WriteFile(config, raw, 0o600); err != nil {
		return taubench.MCPOptions{}, err
	}
	return taubench.MCPOptions{
		Recovers: true, Via: taubench.ViaMCPProxy, IdemServer: taubench.ServerMCPProxy, IdemRecords: taubench.Bolt,
		Command: func(exe string, sc taubench.ServeConfig) (*exec.Cmd, error) {
			behind := sc.Idem
			sc.Idem = false
			server, err := taubench.MCPServerCommand(exe, sc)
			if err != nil || !behind {
				return server, err
			}
			args := append([]string{"mcp-proxy", "--db", sc.DB + ".proxy", "--config", config, "--", exe}, server.Args[1:]...)
			return exec.Command(exe, args...), nil
		},
	}, nil
}

// envTaubenchData names the directory of the τ-bench data when --data is
// not given.
const envTaubenchData = "IDEM_TAUBENCH_DATA"

// errNoTaubenchData is wrapped by findData's error when the default places
// (beside the checkouts) hold no τ-bench data: then the built-in sample is
// played. --data and $IDEM_TAUBENCH_DATA that hold none are errors of their
// own, with no fallback.
var errNoTaubenchData = errors.New("τ-bench retail data not found")

// retailData returns the directory of the retail data that taubench and
// taubench serve use: findData's, or, when no τ-bench data is found in the
// default places, a temporary directory holding the built-in sample
// (taubench.WriteSample; sample is true). cleanup removes what it made; call
// it when done, also after an error.
func (a *app) retailData(flag string) (dir string, sample bool, cleanup func(), err error) {
	cleanup = func() {}
	dir, err = findData(flag, a.getenv, workDir(), buildCheckout())
	if !errors.Is(err, errNoTaubenchData) {
		return dir, false, cleanup, err
	}
	tmp, err := os.MkdirTemp("", "idem-taubench-sample-")
	if err != nil {
		return "", false, cleanup, err
	}
	cleanup = func() { _ = os.RemoveAll(tmp) }
	if err := taubench.WriteSample(tmp); err != nil {
		return "", false, cleanup, err
	}
	return tmp, true, cleanup, nil
}

// sampleNotice is the line on stderr of a run of the built-in sample.
func sampleNotice(tasks int) string {
	return fmt.Sprintf("τ-bench: no τ-bench data found: playing idem's built-in sample (%d tasks of a generated retail "+
		"world over the same 16 tools, not τ-bench's); to play τ-bench's retail tasks, point at them with --data DIR or "+
		"$%s, or put them at ../shared/taubench/retail beside the idem checkout", tasks, envTaubenchData)
}

// findData returns the directory of the τ-bench retail data: flag if given,
// else $IDEM_TAUBENCH_DATA if set (each then the only place looked at), else
// the first of ../shared/taubench/retail beside the checkout holding wd (or
// beside wd) and beside the checkout the program was built from (built; ""
// if unknown) that holds the data. The error names every place looked at.
func findData(flag string, getenv func(string) string, wd, built string) (string, error) {
	if flag != "" {
		return taubench.FindDataDir(flag)
	}
	if dir := getenv(envTaubenchData); dir != "" {
		dir, err := taubench.FindDataDir(dir)
		if err != nil {
			return "", fmt.Errorf("$%s: %w", envTaubenchData, err)
		}
		return dir, nil
	}
	var tried []string
	for _, root := range []string{checkoutRoot(wd), checkoutRoot(built)} {
		if root == "" {
			continue
		}
		candidate := taubench.DefaultDataDir(root)
		if slices.Contains(tried, candidate) {
			continue
		}
		if dir, err := taubench.FindDataDir(candidate); err == nil {
			return dir, nil
		}
		tried = append(tried, candidate)
	}
	return "", fmt.Errorf("%w (looked in %s): get τ-bench from "+
		"https://github.com/sierra-research/tau-bench (the retail domain: %s, %s, %s and %s) and "+
		"point to it with --data DIR or $%s, or put it at ../shared/taubench/retail beside the idem checkout",
		errNoTaubenchData, strings.Join(tried, ", "), taubench.OrdersFile, taubench.UsersFile, taubench.ProductsFile, taubench.TasksFile, envTaubenchData)
}

// checkoutRoot is the nearest directory from dir up whose go.mod is the
// engine's module: the root of an idem checkout holding dir. Outside one it
// is dir itself; "" stays "".
func checkoutRoot(dir string) string {
	if dir == "" {
		return ""
	}
	for d := dir; ; d = filepath.Dir(d) {
		if b, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil &&
			strings.HasPrefix(string(b), "module github.com/idemkit/idem\n") {
			return d
		}
		if filepath.Dir(d) == d {
			return dir
		}
	}
}

// workDir is the working directory, "" if it cannot be read.
func workDir() string {
	wd, err := os.Getwd()
	if err != nil {
		return ""
	}
	return wd
}

// buildCheckout is where findData looks for the checkout the program was
// built from: builtFrom, except in tests that play a program built elsewhere.
var buildCheckout = builtFrom

// builtFrom is the directory of this file when the program was compiled, if
// the build recorded it (a build without -trimpath does) and it still
// exists: the checkout of a `go install ./cmd/idem`. "" otherwise.
func builtFrom() string {
	_, file, _, ok := runtime.Caller(0)
	if !ok || !filepath.IsAbs(file) {
		return ""
	}
	dir := filepath.Dir(file)
	if _, err := os.Stat(dir); err != nil {
		return ""
	}
	return dir
}

// rowProgress returns a Config.Progress that prints a line to w each time a
// row of the report (a schedule in a mode, over every task) is done: the
// progress of a run whose stderr is not a terminal.
func rowProgress(w io.Writer, schedules []taubench.Schedule, baseline bool, tasks int) func(done, total int) {
	modes := []taubench.Mode{taubench.Idem}
	if baseline {
		modes = []taubench.Mode{taubench.Baseline, taubench.Idem}
	}
	rows := len(schedules) * len(modes)
	fmt.Fprintf(w, "τ-bench: %s × %s × %s\n", plural(tasks, "task", "tasks"),
		plural(len(schedules), "schedule", "schedules"), plural(len(modes), "mode", "modes"))
	return func(done, _ int) {
		if tasks == 0 || done%tasks != 0 {
			return
		}
		row := done/tasks - 1
		fmt.Fprintf(w, "τ-bench: %d/%d rows done (%s, %s)\n", row+1, rows, schedules[row/len(modes)], modes[row%len(modes)])
	}
}

// repeatLine is the command that repeats this run: its flags as given (a
// password in --pg replaced by xxxxx), and the seed it used.
func repeatLine(cmd *cobra.Command, seed uint64) string {
	line := []string{"idem taubench"}
	cmd.Flags().Visit(func(f *pflag.Flag) {
		switch f.Name {
		case "seed":
		case "pg":
			line = append(line, "--pg="+redactDSN(f.Value.String()))
		default:
			line = append(line, fmt.Sprintf("--%s=%s", f.Name, f.Value))
		}
	})
	return strings.Join(append(line, fmt.Sprintf("--seed=%d", seed)), " ")
}

// dsnPassword is a password in a key=value DSN.
var dsnPassword = regexp.MustCompile(`(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)`)

// redactDSN returns dsn with its password, in a URL or as a key=value pair,
// replaced by xxxxx.
func redactDSN(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.Scheme != "" {
		return u.Redacted()
	}
	return dsnPassword.ReplaceAllString(dsn, "${1}xxxxx")
}
