package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemmcp"
	"github.com/idemkit/idem/kit/taubench"
)

// TestMain runs this test binary as a crash child of the taubench crash
// schedule, an MCP tool server child or the mcp-proxy of --via mcp-proxy when
// the runner starts it so (as the installed program runs them), else the
// tests.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && (os.Args[1] == taubench.ChildCommand || os.Args[1] == taubench.MCPServerChildCommand || os.Args[1] == "mcp-proxy") {
		os.Exit(run(context.Background(), os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// taubenchData returns the τ-bench retail data: $IDEM_TAUBENCH_DATA if set,
// else beside the checkout. Without it the test is skipped, except under
// CI=true, where it fails: the τ-bench run is the acceptance test.
func taubenchData(t *testing.T) string {
	t.Helper()
	dir := filepath.Join("..", "..", "..", "shared", "taubench", "retail")
	if env := os.Getenv(envTaubenchData); env != "" {
		dir = env
	}
	dir, err := taubench.FindDataDir(dir)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	return dir
}

// TestTaubench plays two tasks under every schedule, crash included (its
// children are this binary through the hidden subcommand), and checks the
// table, its legend and the progress lines.
func TestTaubench(t *testing.T) {
	data := taubenchData(t)
	r := idemCmd(t, nil, "", "taubench", "--data", data, "--limit", "2", "--seed", "3")
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	for _, s := range taubench.Schedules {
		require.Contains(t, r.stdout, "| "+string(s)+" | idem | 2/2 | 0 | 0 | 0 |")
	}
	require.Contains(t, r.stdout, "| crash | baseline |")
	require.Contains(t, r.stdout, taubench.Legend, "the table has its legend")
	lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
	require.Equal(t, "τ-bench: 2 tasks × 6 schedules × 2 modes", lines[0])
	require.Len(t, lines, 1+12, "a progress line per row:\n%s", r.stderr)
	require.Equal(t, "τ-bench: 12/12 rows done (mutated, idem)", lines[12])
	require.Contains(t, r.stdout, "repeat with: idem taubench --data="+data+" --limit=2 --seed=3")

	r = idemCmd(t, nil, "", "--json", "taubench", "--data", data, "--limit", "1", "--seed", "3", "--baseline=false")
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	rep := decode[taubench.Report](t, r.stdout)
	require.Len(t, rep.Rows, len(taubench.Schedules))
	require.True(t, rep.OK())
}

// TestTaubenchChildIsOnlyAnArgument: the crash child is the hidden
// subcommand; help does not list it, and it refuses a bad spec.
func TestTaubenchChildIsOnlyAnArgument(t *testing.T) {
	r := idemCmd(t, nil, "", "--help")
	require.Equal(t, 0, r.code)
	require.NotContains(t, r.stdout, taubench.ChildCommand)
	r = idemCmd(t, nil, "", taubench.ChildCommand, "{not json")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "crash child spec")
}

// TestFindData: --data, then $IDEM_TAUBENCH_DATA, each the only place
// looked at when given; then beside the checkout of the working directory,
// then beside the checkout the program was built from; an error naming every
// place otherwise.
func TestFindData(t *testing.T) {
	// A fake checkout: root/go.mod of the engine's module, root/sub (the
	// working directory), and root/../shared/taubench/retail.
	mkData := func(dir string) string {
		require.NoError(t, os.MkdirAll(dir, 0o755))
		for _, f := range []string{taubench.OrdersFile, taubench.UsersFile, taubench.ProductsFile, taubench.TasksFile} {
			require.NoError(t, os.WriteFile(filepath.Join(dir, f), []byte("{}"), 0o600))
		}
		return dir
	}
	mkCheckout := func(parent string) (root string) {
		root = filepath.Join(parent, "idem")
		require.NoError(t, os.MkdirAll(filepath.Join(root, "cmd", "idem"), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(root, "go.mod"), []byte("module github.com/idemkit/idem\n\ngo 1.26\n"), 0o600))
		return root
	}
	noEnv := func(string) string { return "" }

	withData := t.TempDir()
	root := mkCheckout(withData)
	shared := mkData(filepath.Join(withData, "shared", "taubench", "retail"))
	bare := t.TempDir()
	bareRoot := mkCheckout(bare)
	elsewhere := mkData(filepath.Join(t.TempDir(), "retail"))

	got, err := findData("", noEnv, filepath.Join(root, "cmd", "idem"), "")
	require.NoError(t, err)
	require.Equal(t, shared, got, "beside the checkout of the working directory")

	got, err = findData("", noEnv, t.TempDir(), filepath.Join(root, "cmd", "idem"))
	require.NoError(t, err)
	require.Equal(t, shared, got, "beside the checkout the program was built from, run elsewhere")

	work := filepath.Join(withData, "work")
	require.NoError(t, os.Mkdir(work, 0o755))
	got, err = findData("", noEnv, work, "")
	require.NoError(t, err)
	require.Equal(t, shared, got, "outside a checkout: beside the working directory")

	got, err = findData(elsewhere, noEnv, root, "")
	require.NoError(t, err)
	require.Equal(t, elsewhere, got, "--data first")

	env := func(k string) string { return map[string]string{envTaubenchData: elsewhere}[k] }
	got, err = findData("", env, root, "")
	require.NoError(t, err)
	require.Equal(t, elsewhere, got, "$IDEM_TAUBENCH_DATA before the checkout")

	_, err = findData(filepath.Join(bare, "nope"), noEnv, root, "")
	require.ErrorContains(t, err, filepath.Join(bare, "nope"), "a --data without the data is an error, with no fallback")
	_, err = findData("", func(string) string { return filepath.Join(bare, "nope") }, root, "")
	require.ErrorContains(t, err, "$IDEM_TAUBENCH_DATA")

	_, err = findData("", noEnv, filepath.Join(bareRoot, "cmd"), bareRoot)
	require.ErrorContains(t, err, "looked in "+filepath.Join(bareRoot, "..", "shared", "taubench", "retail"))
	require.ErrorContains(t, err, "--data DIR or $IDEM_TAUBENCH_DATA")
	require.ErrorContains(t, err, "github.com/sierra-research/tau-bench")
}

// TestTaubenchViaMCP plays two tasks over MCP through the command, with the
// tool servers as children of the test binary (its TestMain runs the
// hidden subcommand for them).
func TestTaubenchViaMCP(t *testing.T) {
	// Under the race detector each child would sleep a second at exit.
	t.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	data := taubenchData(t)
	r := idemCmd(t, nil, "", "taubench", "--via", "mcp", "--limit", "2", "--seed", "3", "--data", data)
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	for _, s := range taubench.Schedules {
		require.Contains(t, r.stdout, "| "+string(s)+" | idem | 2/2 | 0 | 0 |")
	}
	require.Contains(t, r.stdout, "--via=mcp")
}

// TestTaubenchViaMCPProxy plays two tasks through idem mcp-proxy (this test
// binary, as TestMain runs it) in front of the tool server without idem:
// outside the crash schedule, every idem row is exact; under it, the kill is
// recovered by the proxy (the crash call answers, the runner checked the
// server ran it recovered), and whatever differs is on the recovered calls,
// in their own columns.
func TestTaubenchViaMCPProxy(t *testing.T) {
	t.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	data := taubenchData(t)
	r := idemCmd(t, nil, "", "--json", "taubench", "--via", "mcp-proxy", "--limit", "2", "--seed", "3", "--data", data)
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	rep := decode[taubench.Report](t, r.stdout)
	require.Len(t, rep.Rows, 2*len(taubench.Schedules))
	for _, row := range rep.Rows {
		if row.Mode == taubench.Baseline {
			require.Zero(t, row.RecoveredCalls, "%s/baseline: no proxy, nothing recovered", row.Schedule)
			continue
		}
		require.Zero(t, row.Diverged, "%s/idem: %v", row.Schedule, row.Failures)
		require.Zero(t, row.ExtraEffects, "%s/idem", row.Schedule)
		require.Zero(t, row.StateMismatches, "%s/idem", row.Schedule)
		if row.Schedule != taubench.Crash {
			require.Equal(t, 2, row.Matched, "%s/idem: %v", row.Schedule, row.Failures)
			require.Zero(t, row.RecoveredCalls, "%s/idem", row.Schedule)
			continue
		}
		require.Equal(t, 2, row.RecoveredCalls, "crash/idem: the proxy recovered each task's killed call")
		require.Equal(t, 2, row.Matched+row.RecoveredDiverged, "crash/idem: a task falls short only by its recovered call: %v", row.Failures)
	}
	require.True(t, rep.OK())

	// The table shows the recovered columns, and the legend says what they
	// hold.
	args := []string{"taubench", "--via", "mcp-proxy", "--limit", "1", "--seed", "3", "--data", data, "--baseline=false"}
	for _, s := range taubench.Schedules {
		if s != taubench.Crash {
			args = append(args, "--"+string(s)+"=false")
		}
	}
	r = idemCmd(t, nil, "", args...)
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	require.Contains(t, r.stdout, "| schedule | mode | tasks matching | outputs diverged | extra effects | state mismatches | recovered calls | recovered diverged | recovered effects |")
	require.Regexp(t, `\| crash \| idem \| [01]/1 \| 0 \| 0 \| 0 \| 1 \| [01] \| [01] \|`, r.stdout)
	require.Contains(t, r.stdout, taubench.RecoveredLegend)
	require.Contains(t, r.stdout, "--via=mcp-proxy")
}

func TestTaubenchViaUnknown(t *testing.T) {
	r := idemCmd(t, nil, "", "taubench", "--via", "carrier-pigeon")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, `--via must be direct, mcp or mcp-proxy, not "carrier-pigeon"`)
}

// serveTaubench runs the idem command args (a taubench serve) in-process,
// with its stdin and stdout a session of client: it returns the session,
// and the command's result once it ends.
func serveTaubench(t *testing.T, client *mcp.Client, args ...string) (*mcp.ClientSession, <-chan result) {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan result, 1)
	go func() {
		var stderr bytes.Buffer
		code := run(t.Context(), args, func(string) string { return "" }, inR, outW, &stderr)
		outW.Close()
		done <- result{code: code, stderr: stderr.String()}
	}()
	cs, err := client.Connect(t.Context(), &mcp.IOTransport{Reader: outR, Writer: inW}, nil)
	require.NoError(t, err)
	return cs, done
}

// TestTaubenchServe drives `idem taubench serve` with a go-sdk client over
// its stdin and stdout, with and without idem.
func TestTaubenchServe(t *testing.T) {
	data := taubenchData(t)
	for _, withIdem := range []bool{true, false} {
		t.Run(fmt.Sprintf("idem=%v", withIdem), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "shop.db")
			client := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil)
			client.AddSendingMiddleware(idemmcp.ClientMiddleware(nil))
			cs, done := serveTaubench(t, client, "--db", path, "taubench", "serve", "--data", data, fmt.Sprintf("--idem=%v", withIdem))
			var tools []string
			for tool, err := range cs.Tools(t.Context(), nil) {
				require.NoError(t, err)
				tools = append(tools, tool.Name)
			}
			require.Len(t, tools, 16)
			args := map[string]any{"order_id": "#W5918442", "address1": "1 Main St", "address2": "", "city": "Austin",
				"state": "TX", "country": "USA", "zip": "78701"}
			ctx := idemmcp.WithKey(t.Context(), "intent-1")
			var answers []*mcp.CallToolResult
			for range 2 {
				res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "modify_pending_order_address", Arguments: args})
				require.NoError(t, err)
				answers = append(answers, res)
			}
			require.Equal(t, withIdem, idemmcp.Replayed(answers[1]))
			require.NoError(t, cs.Close())
			r := <-done
			require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
		})
	}
}

// TestTaubenchPostgres plays two tasks under every schedule with
// --backend postgres, the DSN from $IDEM_TEST_PG (crash children are this
// binary), then one through --via mcp-proxy: every idem row matches, and the
// table says where it ran.
func TestTaubenchPostgres(t *testing.T) {
	dsn, _ := testPG(t, "IDEM_TEST_PG")
	data := taubenchData(t)
	env := map[string]string{"IDEM_TEST_PG": dsn}
	r := idemCmd(t, env, "", "taubench", "--backend", "postgres", "--data", data, "--limit", "2", "--seed", "1")
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	require.Contains(t, r.stdout, "τ-bench retail on postgres, 2 tasks, seed 1")
	for _, s := range taubench.Schedules {
		require.Contains(t, r.stdout, "| "+string(s)+" | idem | 2/2 | 0 | 0 | 0 |")
	}
	require.Contains(t, r.stdout, "--backend=postgres")

	t.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	r = idemCmd(t, nil, "", "--json", "taubench", "--backend", "postgres", "--pg", dsn, "--via", "mcp-proxy",
		"--data", data, "--limit", "1", "--seed", "1", "--baseline=false")
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	rep := decode[taubench.Report](t, r.stdout)
	require.Equal(t, taubench.Postgres, rep.Backend)
	require.True(t, rep.OK(), "%+v", rep.Rows)
	require.Equal(t, taubench.ViaMCPProxy, rep.Via)
	for _, row := range rep.Rows {
		// The tool server's tables are on Postgres, the proxy's records in
		// its bbolt file.
		require.Equal(t, []any{taubench.ServerMCPProxy, taubench.Bolt}, []any{row.Server, row.Records})
		if row.Schedule == taubench.Crash {
			require.Len(t, row.Crashes, 1)
			require.Equal(t, taubench.KilledToolServer, row.Crashes[0].Killed)
		}
	}
}

func TestTaubenchBackendUsage(t *testing.T) {
	r := idemCmd(t, nil, "", "taubench", "--backend", "postgres")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "--backend postgres needs --pg DSN (or $IDEM_PG or $IDEM_TEST_PG)")
	r = idemCmd(t, nil, "", "taubench", "--backend", "sqlite")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, `--backend must be bbolt or postgres, not "sqlite"`)
	r = idemCmd(t, nil, "", "taubench", "--backend", "postgres", "--pg", "postgres://u:secret@127.0.0.1:1/db?connect_timeout=1", "--limit", "1")
	require.Equal(t, 1, r.code)
	require.NotContains(t, r.stderr, "secret", "the password stays out of the error")
}

func TestRedactDSN(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://u:secret@h:5432/db?sslmode=disable": "postgres://u:xxxxx@h:5432/db?sslmode=disable",
		"postgres://u@h/db":                             "postgres://u@h/db",
		"host=h user=u password=secret dbname=db":       "host=h user=u password=xxxxx dbname=db",
		"host=h password = 'se cret' dbname=db":         "host=h password = xxxxx dbname=db",
	} {
		require.Equal(t, want, redactDSN(in), in)
	}
}

// noTaubenchData makes the command find no τ-bench data in its default
// places, as on a fresh clone with nothing beside it: the working directory
// and the checkout the program was built from are temporary directories with
// no ../shared. Not parallel (the working directory, buildCheckout).
func noTaubenchData(t *testing.T) {
	t.Chdir(t.TempDir())
	built := t.TempDir()
	old := buildCheckout
	buildCheckout = func() string { return built }
	t.Cleanup(func() { buildCheckout = old })
}

// TestTaubenchSampleWhenNoData: with no τ-bench data found, the README's
// first command plays the built-in sample, says so in one line on stderr
// (naming the ways to point at τ-bench), and every idem row matches under
// every schedule, beside the baseline; the report says it was the sample.
// --data and $IDEM_TAUBENCH_DATA still win, and one that holds no data is an
// error, with no fallback.
func TestTaubenchSampleWhenNoData(t *testing.T) {
	noTaubenchData(t)
	r := idemCmd(t, nil, "", "taubench", "--seed", "1")
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
	require.Equal(t, sampleNotice(24), lines[0])
	for _, way := range []string{"--data DIR", "$IDEM_TAUBENCH_DATA", "../shared/taubench/retail"} {
		require.Contains(t, lines[0], way)
	}
	require.Equal(t, "τ-bench: 24 tasks × 6 schedules × 2 modes", lines[1])
	require.Contains(t, r.stdout, "idem's built-in retail sample (generated, not τ-bench's tasks), 24 tasks, seed 1")
	for _, s := range taubench.Schedules {
		require.Contains(t, r.stdout, "| "+string(s)+" | idem | 24/24 | 0 | 0 | 0 |")
	}
	require.Contains(t, r.stdout, "| none | baseline | 24/24 | 0 | 0 | 0 |")
	require.NotContains(t, r.stdout, "| duplicate | baseline | 24/24 |", "the baseline shows the damage")

	r = idemCmd(t, nil, "", "--json", "taubench", "--seed", "1", "--limit", "2", "--baseline=false", "--crash=false")
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	require.Contains(t, r.stderr, sampleNotice(24))
	rep := decode[taubench.Report](t, r.stdout)
	require.True(t, rep.Sample)
	require.True(t, rep.OK())

	// --data and $IDEM_TAUBENCH_DATA win: a directory holding data (here a
	// copy of the sample's files) is played as τ-bench data, without the
	// notice.
	data := t.TempDir()
	require.NoError(t, taubench.WriteSample(data))
	for _, r := range []result{
		idemCmd(t, nil, "", "--json", "taubench", "--data", data, "--limit", "1", "--none=false", "--crash=false"),
		idemCmd(t, map[string]string{envTaubenchData: data}, "", "--json", "taubench", "--limit", "1", "--none=false", "--crash=false"),
	} {
		require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
		require.NotContains(t, r.stderr, "built-in sample")
		require.False(t, decode[taubench.Report](t, r.stdout).Sample)
	}
	empty := t.TempDir()
	for _, r := range []result{
		idemCmd(t, nil, "", "taubench", "--data", empty),
		idemCmd(t, map[string]string{envTaubenchData: empty}, "", "taubench"),
	} {
		require.Equal(t, 1, r.code)
		require.Contains(t, r.stderr, "τ-bench retail data not found in "+empty)
		require.NotContains(t, r.stderr, "built-in sample")
	}
}

// TestTaubenchServeSample: with no τ-bench data found, taubench serve seeds
// a new file with the built-in sample, and says so on stderr.
func TestTaubenchServeSample(t *testing.T) {
	noTaubenchData(t)
	sample := t.TempDir()
	require.NoError(t, taubench.WriteSample(sample))
	tasks, err := taubench.LoadTasks(filepath.Join(sample, taubench.TasksFile))
	require.NoError(t, err)
	want := tasks[0].Actions[2] // get_order_details of the first task
	require.Equal(t, "get_order_details", want.Name)

	path := filepath.Join(t.TempDir(), "shop.db")
	cs, done := serveTaubench(t, mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil), "--db", path, "taubench", "serve")
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: want.Name, Arguments: want.Kwargs})
	require.NoError(t, err)
	require.Equal(t, want.Output, res.Content[0].(*mcp.TextContent).Text)
	require.NoError(t, cs.Close())
	r := <-done
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	require.Contains(t, r.stderr, "seeding "+path+" with idem's built-in sample")
}

// TestTaubenchJSONSaysWhereItRan: the --json report says which transport
// ran (--via), which server each row's calls reached and where its records
// were, and lists every crash row's kill points, also over MCP and through
// idem mcp-proxy, so that they can be checked from the report: behind the
// proxy, every kill is a recovered call, and the kills after a commit that
// changed something are what the baseline and the recovered columns pay, one
// each.
func TestTaubenchJSONSaysWhereItRan(t *testing.T) {
	noTaubenchData(t)
	t.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	sample := t.TempDir()
	require.NoError(t, taubench.WriteSample(sample))
	tasks, err := taubench.LoadTasks(filepath.Join(sample, taubench.TasksFile))
	require.NoError(t, err)
	crashOnly := []string{"--seed", "5", "--limit", "12"}
	for _, s := range taubench.Schedules {
		if s != taubench.Crash {
			crashOnly = append(crashOnly, "--"+string(s)+"=false")
		}
	}
	// afterCommit counts the kills after the commit of a call whose
	// reference answer is not an error, checking that each kill is in a
	// write call of its task.
	afterCommit := func(row taubench.Row, point string) int {
		n := 0
		for _, c := range row.Crashes {
			a := tasks[c.Task].Actions[c.Action]
			tool, _ := taubench.Lookup(a.Name)
			require.True(t, tool.Write, "killed in %s", a.Name)
			if c.Point == point && !strings.HasPrefix(a.Output, "Error") {
				n++
			}
		}
		return n
	}
	for _, tc := range []struct {
		via, server, baseServer string
		records                 taubench.Backend
		killed                  string
		after                   string
	}{
		{"direct", "", "", taubench.Bolt, taubench.KilledCrashChild, "taubench-after-commit"},
		{"mcp", taubench.ServerIdemMCP, taubench.ServerPlain, taubench.Bolt, taubench.KilledToolServer, taubench.MCPAfterCommit},
		{"mcp-proxy", taubench.ServerMCPProxy, taubench.ServerPlain, taubench.Bolt, taubench.KilledToolServer, taubench.MCPAfterCommit},
	} {
		t.Run(tc.via, func(t *testing.T) {
			r := idemCmd(t, nil, "", append([]string{"--json", "taubench", "--via", tc.via}, crashOnly...)...)
			require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
			rep := decode[taubench.Report](t, r.stdout)
			require.Equal(t, tc.via, rep.Via)
			require.Len(t, rep.Rows, 2)
			base, idem := rep.Rows[0], rep.Rows[1]
			require.Equal(t, tc.server, idem.Server)
			require.Equal(t, tc.baseServer, base.Server)
			require.Equal(t, tc.records, idem.Records)
			require.Empty(t, base.Records)
			require.Len(t, base.Crashes, 12, "every one of the first 12 tasks has a write call")
			require.Equal(t, base.Crashes, idem.Crashes)
			for _, c := range base.Crashes {
				require.Equal(t, tc.killed, c.Killed)
			}
			paid := afterCommit(base, tc.after)
			require.Positive(t, paid)
			require.Equal(t, paid, base.Diverged+base.ExtraEffects, "the baseline pays for each kill after a commit")
			require.Zero(t, idem.Diverged+idem.ExtraEffects+idem.StateMismatches)
			if tc.via == "mcp-proxy" {
				require.Equal(t, len(idem.Crashes), idem.RecoveredCalls, "the proxy recovered every killed call")
				require.Equal(t, paid, idem.RecoveredDiverged+idem.RecoveredEffects, "and the recovered calls pay as the baseline")
			} else {
				require.Equal(t, 12, idem.Matched)
				require.Zero(t, idem.RecoveredCalls)
			}
		})
	}
}
