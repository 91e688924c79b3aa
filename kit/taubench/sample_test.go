package taubench

import (
	"path/filepath"
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
