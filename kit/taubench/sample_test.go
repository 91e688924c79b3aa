package taubench

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// sampleDir writes the built-in sample into a temporary directory.
func sampleDir(t *testing.T) (dir string, tasks []Task) {
	t.Helper()
	dir = t.TempDir()
	require.NoError(t, WriteSample(dir))
	tasks, err := LoadTasks(filepath.Join(dir, TasksFile))
	require.NoError(t, err)
	return dir, tasks
}

// TestSampleReference: the sample's reference outputs and changed records
// are those of a fault-free run of the tools, each task on a fresh copy of
// its world; and its tasks call every one of the 16 tools, and write with
// each write tool.
func TestSampleReference(t *testing.T) {
	dir, tasks := sampleDir(t)
	require.Len(t, tasks, 24)
	image := seededImage(t, dir)
	initial := dbSnapshot(t, openImage(t, image))
	require.Len(t, initial["products"], 8)
	require.Len(t, initial["users"], 30)
	replayTasks(t, image, initial, tasks)

	called := map[string]bool{}
	changed := 0
	for _, task := range tasks {
		for _, a := range task.Actions {
			called[a.Name] = true
		}
		if len(task.Changed) > 0 {
			changed++
		}
	}
	for _, tool := range Tools() {
		require.True(t, called[tool.Name], "no task of the sample calls %s", tool.Name)
	}
	require.Equal(t, 22, changed, "every task but the two read-only ones changes a record")
}

// TestRunnerSample plays the whole sample under every schedule, through idem
// and the baseline, crash children killed for real, as idem taubench plays it
// when it finds no τ-bench data: every idem row matches, and the baseline
// shows the damage.
func TestRunnerSample(t *testing.T) {
	dir, tasks := sampleDir(t)
	rep, err := Run(t.Context(), Config{
		DataDir: dir, Tasks: tasks, TasksFile: filepath.Join(dir, TasksFile),
		Baseline: true, Seed: 7, WorkDir: t.TempDir(),
	})
	require.NoError(t, err)
	requireReport(t, rep, len(tasks))
}

// killsWithEffect checks a crash row's kill points against the tasks: one
// per task with a write call, in task order, each in a write call of its task,
// at a crash point of the run (points) by the process killed; and returns how
// many leave an effect behind (after the commit, in a call whose reference
// answer is not an error), which is what a row without idem pays for them.
func killsWithEffect(t *testing.T, tasks []Task, row Row, killed string, points ...string) int {
	t.Helper()
	var want []int
	byID := map[int]Task{}
	for _, task := range tasks {
		byID[task.ID] = task
		if slices.ContainsFunc(task.Actions, func(a Action) bool { tool, _ := Lookup(a.Name); return tool.Write }) {
			want = append(want, task.ID)
		}
	}
	var got []int
	effect := 0
	for _, c := range row.Crashes {
		got = append(got, c.Task)
		a := byID[c.Task].Actions[c.Action]
		tool, _ := Lookup(a.Name)
		require.True(t, tool.Write, "task %d: killed in action %d, %s, not a write", c.Task, c.Action, a.Name)
		require.Contains(t, points, c.Point)
		require.Equal(t, killed, c.Killed)
		if c.Point == points[1] && !strings.HasPrefix(a.Output, "Error") {
			effect++
		}
	}
	require.Equal(t, want, got, "%s/%s: a kill per task with a write call", row.Schedule, row.Mode)
	return effect
}

// TestRunMCPSampleCrashes plays the sample's crash schedule over MCP: the
// report says how the calls went (via, each row's server and records), and
// each crash row lists its kill points, the same in both modes, which the
// counts bear out: the baseline pays one divergent answer or extra effect
// per kill after a commit that changed something, idem nothing.
func TestRunMCPSampleCrashes(t *testing.T) {
	dir, tasks := sampleDir(t)
	t.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	rep, err := RunMCP(t.Context(), Config{
		DataDir: dir, Tasks: tasks, TasksFile: filepath.Join(dir, TasksFile), Schedules: []Schedule{Crash},
		Baseline: true, Seed: 5, WorkDir: t.TempDir(),
	})
	require.NoError(t, err)
	require.Equal(t, ViaMCP, rep.Via)
	require.Len(t, rep.Rows, 2)
	base, idem := rep.Rows[0], rep.Rows[1]
	require.Equal(t, []string{ServerPlain, ServerIdemMCP}, []string{base.Server, idem.Server})
	require.Equal(t, []Backend{"", Bolt}, []Backend{base.Records, idem.Records})
	require.Equal(t, base.Crashes, idem.Crashes, "both modes kill at the same points")
	effect := killsWithEffect(t, tasks, base, KilledToolServer, MCPBeforeCommit, MCPAfterCommit)
	require.Positive(t, effect, "seed 5 kills some call after its commit")
	require.Less(t, effect, len(base.Crashes), "and some before")
	require.Equal(t, effect, base.Diverged+base.ExtraEffects, "the baseline pays for each kill after a commit")
	require.Equal(t, len(tasks), idem.Matched, "%v", idem.Failures)
	require.Zero(t, idem.Diverged+idem.ExtraEffects)

	// The direct runner kills its crash child at the same choices.
	direct, err := Run(t.Context(), Config{
		DataDir: dir, Tasks: tasks, TasksFile: filepath.Join(dir, TasksFile), Schedules: []Schedule{Crash},
		Baseline: true, Seed: 5, WorkDir: t.TempDir(),
	})
	require.NoError(t, err)
	require.Equal(t, ViaDirect, direct.Via)
	require.Equal(t, []string{"", ""}, []string{direct.Rows[0].Server, direct.Rows[1].Server})
	require.Equal(t, []Backend{"", Bolt}, []Backend{direct.Rows[0].Records, direct.Rows[1].Records})
	require.Equal(t, effect, killsWithEffect(t, tasks, direct.Rows[0], KilledCrashChild, crashPoints...))
	require.Equal(t, effect, direct.Rows[0].Diverged+direct.Rows[0].ExtraEffects)
	for i, c := range direct.Rows[0].Crashes {
		m := base.Crashes[i]
		require.Equal(t, []int{m.Task, m.Action}, []int{c.Task, c.Action}, "one seed, one choice over MCP and direct")
	}
}
