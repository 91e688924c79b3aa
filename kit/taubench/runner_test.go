package taubench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) {
	ChildMain(os.Args[1:]) // a crash child of TestRunner is this binary re-executed
	os.Exit(m.Run())
}

// TestRunner plays a subset of the tasks under every schedule, through idem
// and the baseline, with crash children killed for real: every idem row must
// match the reference with no divergent answer and no extra effect, and the
// baseline must show the damage that idem prevents.
func TestRunner(t *testing.T) {
	dir := testDataDir(t)
	tasksFile := filepath.Join(dir, TasksFile)
	tasks, err := LoadTasks(tasksFile)
	require.NoError(t, err)
	n := 24
	if testing.Short() {
		n = 8
	}
	rep, err := Run(t.Context(), Config{
		DataDir: dir, Tasks: tasks[:n], TasksFile: tasksFile,
		Baseline: true, Seed: 7, WorkDir: t.TempDir(),
	})
	require.NoError(t, err)
	requireReport(t, rep, n)
}

// requireReport checks a run of n tasks under every schedule, with the
// baseline: every idem row matches all n tasks with no diverged answer and
// no extra effect, the baseline is right without faults (schedule none) and
// shows damage under them, and the report is OK.
func requireReport(t *testing.T, rep *Report, n int) {
	t.Helper()
	require.Len(t, rep.Rows, 2*len(Schedules))
	damage := 0
	for _, row := range rep.Rows {
		if row.Mode == Idem {
			require.Equal(t, n, row.Matched, "%s/idem: %v", row.Schedule, row.Failures)
			require.Zero(t, row.Diverged, "%s/idem", row.Schedule)
			require.Zero(t, row.ExtraEffects, "%s/idem", row.Schedule)
			continue
		}
		if row.Schedule == None {
			require.Equal(t, n, row.Matched, "the tools are right: %v", row.Failures)
		}
		damage += row.Diverged + row.ExtraEffects
	}
	require.Positive(t, damage, "the baseline shows what idem prevents")
	require.True(t, rep.OK())
}

// TestRunnerSeedRepeats: a seed repeats its random choices (where the crash
// schedule kills each task, the keys), so two runs with one seed give the
// same report, choices included; another seed makes other choices.
func TestRunnerSeedRepeats(t *testing.T) {
	dir := testDataDir(t)
	tasksFile := filepath.Join(dir, TasksFile)
	tasks, err := LoadTasks(tasksFile)
	require.NoError(t, err)
	run := func(seed uint64) *Report {
		rep, err := Run(t.Context(), Config{
			DataDir: dir, Tasks: tasks[:6], TasksFile: tasksFile, Schedules: []Schedule{Crash},
			Baseline: true, Seed: seed, WorkDir: t.TempDir(),
		})
		require.NoError(t, err)
		return rep
	}
	first := run(42)
	require.Len(t, first.Rows, 2)
	crashes := first.Rows[0].Crashes
	require.NotEmpty(t, crashes, "the crash schedule crashed some task")
	require.Equal(t, crashes, first.Rows[1].Crashes, "both modes crash the same places")
	for _, c := range crashes {
		require.Contains(t, crashPoints, c.Point)
	}
	require.Equal(t, first, run(42), "one seed, one report, choices included")
	other := run(43)
	require.NotEqual(t, crashes, other.Rows[0].Crashes, "the seed decides the choices")
	p := &play{cfg: &Config{Seed: 42}, task: tasks[0]}
	q := &play{cfg: &Config{Seed: 43}, task: tasks[0]}
	require.Equal(t, p.key(0), p.key(0))
	require.NotEqual(t, p.key(0), q.key(0), "the seed decides the keys")
}

// TestReportRecovered: the recovered columns appear only when a row has
// recovered calls; OK tolerates divergent answers of recovered calls (and
// the tasks they leave unmatched), not any other shortfall.
func TestReportRecovered(t *testing.T) {
	plain := &Report{Tasks: 2, Rows: []Row{{Schedule: Crash, Mode: Idem, Tasks: 2, Matched: 2}}}
	var b strings.Builder
	WriteTable(&b, plain)
	require.NotContains(t, b.String(), "recovered")
	require.True(t, plain.OK())

	row := Row{Schedule: Crash, Mode: Idem, Tasks: 2, Matched: 1, RecoveredCalls: 2, RecoveredDiverged: 1, RecoveredEffects: 1}
	rep := &Report{Tasks: 2, Rows: []Row{row}}
	b.Reset()
	WriteTable(&b, rep)
	require.Contains(t, b.String(), "| crash | idem | 1/2 | 0 | 0 | 0 | 2 | 1 | 1 |")
	require.Contains(t, b.String(), RecoveredLegend)
	require.True(t, rep.OK(), "the shortfall is the recovered call's")

	for name, bad := range map[string]func(*Row){
		"a divergent answer":      func(r *Row) { r.Diverged = 1 },
		"an extra effect":         func(r *Row) { r.ExtraEffects = 1 },
		"a state mismatch":        func(r *Row) { r.StateMismatches = 1 },
		"unmatched, no recovered": func(r *Row) { r.RecoveredDiverged = 0 },
	} {
		r := row
		bad(&r)
		require.False(t, (&Report{Rows: []Row{r}}).OK(), name)
	}
	require.False(t, (&Report{Rows: []Row{{Mode: Idem, Tasks: 2, Matched: 1}}}).OK())
}

// TestRemoveBeside: the files beside a place go, the place's name taken
// literally (no pattern in it), and an empty name removes nothing.
func TestRemoveBeside(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	for _, f := range []string{".git", "a[1].db", "a[1].db.proxy", "a1.db.proxy", "b.db.x"} {
		require.NoError(t, os.WriteFile(f, nil, 0o600))
	}
	removeBeside("")
	removeBeside(filepath.Join(dir, "a[1].db"))
	left, err := filepath.Glob(filepath.Join(dir, "*")) // dot files too
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"a[1].db", "a1.db.proxy", "b.db.x", ".git"}, baseNames(left))
}

func baseNames(paths []string) []string {
	names := make([]string, len(paths))
	for i, p := range paths {
		names[i] = filepath.Base(p)
	}
	return names
}

// TestReportBackend: the table names a backend other than bbolt, and says
// how many crashed calls were taken over, per row that has any.
func TestReportBackend(t *testing.T) {
	var b strings.Builder
	WriteTable(&b, &Report{Tasks: 1, Seed: 2, Backend: Bolt, Rows: []Row{{Schedule: Crash, Mode: Idem, Tasks: 1, Matched: 1}}})
	require.Contains(t, b.String(), "τ-bench retail, 1 tasks, seed 2\n")
	require.NotContains(t, b.String(), "took each over")
	b.Reset()
	WriteTable(&b, &Report{Tasks: 1, Seed: 2, Backend: Postgres, Rows: []Row{{Schedule: Crash, Mode: Idem, Tasks: 1, Matched: 1, Takeovers: 1}}})
	require.Contains(t, b.String(), "τ-bench retail on postgres, 1 tasks, seed 2\n")
	require.Contains(t, b.String(), "crash/idem: 1 of the crashed calls were in the Do form: a second process took each over")
	b.Reset()
	WriteTable(&b, &Report{Via: ViaMCPProxy, Tasks: 1, Seed: 2, Backend: Postgres, Sample: true})
	require.Contains(t, b.String(), "idem's built-in retail sample (generated, not τ-bench's tasks) on postgres via mcp-proxy, 1 tasks, seed 2\n")
	b.Reset()
	WriteTable(&b, &Report{Via: ViaDirect, Tasks: 1, Seed: 2, Backend: Bolt})
	require.Contains(t, b.String(), "τ-bench retail, 1 tasks, seed 2\n", "a direct run on bbolt names neither")
}
