package taubench

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// envTestPG names the Postgres server of the tests (scripts/postgres.sh
// start prints it), as for idempg's.
const envTestPG = "IDEM_TEST_PG"

// testPG returns the DSN of the test server: without one the test is
// skipped when run by hand, and fails when CI is set.
func testPG(t *testing.T) string {
	t.Helper()
	dsn := os.Getenv(envTestPG)
	if dsn == "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set and %s is not: start the server with scripts/postgres.sh start", envTestPG)
		}
		t.Skipf("%s not set: eval \"$(scripts/postgres.sh start)\" runs a local server", envTestPG)
	}
	return dsn
}

// stagePrefixes records the schema prefix of every stage made until the
// test ends.
func stagePrefixes(t *testing.T) *[]string {
	var (
		mu       sync.Mutex
		prefixes []string
	)
	testStagePrefix = func(p string) string {
		mu.Lock()
		defer mu.Unlock()
		prefixes = append(prefixes, p)
		return p
	}
	t.Cleanup(func() { testStagePrefix = nil })
	return &prefixes
}

// leftSchemas returns the schemas on the server whose names start with
// prefix.
func leftSchemas(t *testing.T, dsn, prefix string) map[string]bool {
	t.Helper()
	pool, err := pgxpool.New(t.Context(), dsn)
	require.NoError(t, err)
	defer pool.Close()
	rows, err := pool.Query(t.Context(), `SELECT nspname FROM pg_namespace WHERE starts_with(nspname, $1)`, prefix)
	require.NoError(t, err)
	defer rows.Close()
	names := map[string]bool{}
	for rows.Next() {
		var n string
		require.NoError(t, rows.Scan(&n))
		names[n] = true
	}
	require.NoError(t, rows.Err())
	return names
}

// TestRunnerPostgres plays a subset of the tasks under every schedule on the
// Postgres backend, through idempg and the baseline, with crash children
// killed for real: every idem row matches the reference with no divergent
// answer and no extra effect; the crash schedule's Do-form calls were taken
// over by this process after the killed child's lease lapsed; the baseline
// shows the damage; and the run leaves no schema behind.
func TestRunnerPostgres(t *testing.T) {
	dsn := testPG(t)
	dir := testDataDir(t)
	tasksFile := filepath.Join(dir, TasksFile)
	tasks, err := LoadTasks(tasksFile)
	require.NoError(t, err)
	n := 4 // seed 20 crashes them in each form at each point
	prefixes := stagePrefixes(t)
	rep, err := Run(t.Context(), Config{
		DataDir: dir, Tasks: tasks[:n], TasksFile: tasksFile,
		Baseline: true, Seed: 20, WorkDir: t.TempDir(), Backend: Postgres, PG: dsn,
	})
	require.NoError(t, err)
	requireReport(t, rep, n)
	for _, row := range rep.Rows {
		if row.Mode != Idem {
			continue
		}
		if row.Schedule == Crash {
			dos, kinds := 0, map[[2]string]bool{}
			for _, c := range row.Crashes {
				require.Contains(t, crashForms, c.Form)
				kinds[[2]string{c.Form, c.Point}] = true
				if c.Form == FormDo {
					dos++
				}
			}
			require.Len(t, kinds, len(crashForms)*len(crashPoints), "the seed crashes each form at each point: %v", row.Crashes)
			require.Equal(t, dos, row.Takeovers, "every Do-form crash was taken over")
		} else {
			require.Zero(t, row.Takeovers)
		}
	}
	require.Len(t, *prefixes, 1)
	require.Empty(t, leftSchemas(t, dsn, (*prefixes)[0]), "the run leaves no schema behind")
}

// TestStoresAgree: every tool answers the same on the bbolt and the Postgres
// store, call by call over the tasks' actions, and leaves the same records.
func TestStoresAgree(t *testing.T) {
	dsn := testPG(t)
	dir := testDataDir(t)
	tasks, err := LoadTasks(filepath.Join(dir, TasksFile))
	require.NoError(t, err)
	ctx := context.Background()
	bs, err := newBoltStage(t.TempDir(), dir)
	require.NoError(t, err)
	ps, err := newPgStage(ctx, dsn, t.TempDir(), dir)
	require.NoError(t, err)
	defer ps.close()
	require.Equal(t, bs.initial(), ps.initial(), "one dataset, one snapshot")
	for _, task := range tasks[:8] {
		bp, err := bs.fresh(ctx, "agree", task.ID, false)
		require.NoError(t, err)
		pp, err := ps.fresh(ctx, "agree", task.ID, false)
		require.NoError(t, err)
		bdb, err := openDB(ctx, bp, false, "")
		require.NoError(t, err)
		pdb, err := openDB(ctx, pp, false, dsn)
		require.NoError(t, err)
		for i, a := range task.Actions {
			tool, ok := Lookup(a.Name)
			require.True(t, ok)
			answers := [2]string{}
			for j, db := range []taskDB{bdb, pdb} {
				run := db.read
				if tool.Write {
					run = db.write
				}
				require.NoError(t, run(ctx, func(s Store) error {
					var err error
					answers[j], err = tool.Run(s, a.Kwargs)
					return err
				}))
			}
			require.Equal(t, answers[0], answers[1], "task %d action %d %s", task.ID, i, a.Name)
		}
		bsnap, err := bdb.snapshot(ctx)
		require.NoError(t, err)
		psnap, err := pdb.snapshot(ctx)
		require.NoError(t, err)
		require.Equal(t, bsnap, psnap, "task %d", task.ID)
		require.NoError(t, bdb.close())
		require.NoError(t, pdb.close())
		bs.remove(bp)
		ps.remove(pp)
	}
}

// TestRunMCPPostgres plays a few tasks over MCP on the Postgres backend:
// the tool server children serve the tools over the task's schema (through
// idemmcp on idempg, write tools in the DoTx form with the pgx.Tx), one is
// killed mid-call under the crash schedule and restarted on the schema, and
// every idem row matches with no extra effect counted by the server.
func TestRunMCPPostgres(t *testing.T) {
	dsn := testPG(t)
	dir := testDataDir(t)
	tasksFile := filepath.Join(dir, TasksFile)
	tasks, err := LoadTasks(tasksFile)
	require.NoError(t, err)
	n := 3
	t.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	rep, err := RunMCP(t.Context(), Config{
		DataDir: dir, Tasks: tasks[:n], TasksFile: tasksFile,
		Baseline: true, Seed: 20, WorkDir: t.TempDir(), Backend: Postgres, PG: dsn,
	})
	require.NoError(t, err)
	requireReport(t, rep, n)
	require.Equal(t, ViaMCP, rep.Via)
	for _, row := range rep.Rows {
		if row.Mode == Idem {
			require.Equal(t, []any{ServerIdemMCP, Postgres}, []any{row.Server, row.Records}, "idempg's records beside the tables")
		}
		if row.Schedule == Crash {
			require.Len(t, row.Crashes, n, "the kill points of an MCP crash row on Postgres")
		}
	}
}

// TestPgStageRemovesOnlyItsOwn: a stage's cleanup removes the files beside
// a task's place and nothing else: not the working directory's dot files
// (the template's place names no file, and its cleanup once globbed ".*").
func TestPgStageRemovesOnlyItsOwn(t *testing.T) {
	dsn := testPG(t)
	dir := testDataDir(t)
	dir, err := filepath.Abs(dir)
	require.NoError(t, err)
	cwd, work := t.TempDir(), t.TempDir()
	t.Chdir(cwd)
	for _, f := range []string{".git", ".gitignore", "keep"} {
		require.NoError(t, os.WriteFile(filepath.Join(cwd, f), []byte("x"), 0o600))
	}
	st, err := newPgStage(t.Context(), dsn, work, dir)
	require.NoError(t, err)
	pl, err := st.fresh(t.Context(), "row", 1, true)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(pl.Path+".proxy", []byte("x"), 0o600))
	st.remove(pl)
	require.NoFileExists(t, pl.Path+".proxy", "what lives beside the place goes with it")
	st.close()
	for _, f := range []string{".git", ".gitignore", "keep"} {
		require.FileExists(t, filepath.Join(cwd, f))
	}
	require.Empty(t, leftSchemas(t, dsn, st.prefix))
}
