package taubench

import (
	"os"
	"path/filepath"
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
