package taubench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRunMCP plays a subset of the tasks over MCP under every schedule, with
// tool server children killed for real: every idem row must match the
// reference with no divergent answer and no extra effect, and the baseline
// (a tool server without idem) must show the damage.
func TestRunMCP(t *testing.T) {
	dir := testDataDir(t)
	tasksFile := filepath.Join(dir, TasksFile)
	tasks, err := LoadTasks(tasksFile)
	require.NoError(t, err)
	n := 12
	if testing.Short() {
		n = 4
	}
	// Each tool server child is this test binary; under the race detector
	// it would sleep a second at exit (GORACE's atexit_sleep_ms).
	t.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	rep, err := RunMCP(t.Context(), Config{
		DataDir: dir, Tasks: tasks[:n], TasksFile: tasksFile,
		Baseline: true, Seed: 7, WorkDir: t.TempDir(),
	})
	require.NoError(t, err)
	require.Len(t, rep.Rows, 2*len(Schedules))
	damage := map[Schedule]int{}
	for _, row := range rep.Rows {
		if row.Mode == Idem {
			require.Equal(t, n, row.Matched, "%s/idem: %v", row.Schedule, row.Failures)
			require.Zero(t, row.Diverged, "%s/idem", row.Schedule)
			require.Zero(t, row.ExtraEffects, "%s/idem", row.Schedule)
			continue
		}
		if row.Schedule == None {
			require.Equal(t, n, row.Matched, "the tools are right over MCP: %v", row.Failures)
		}
		damage[row.Schedule] += row.Diverged + row.ExtraEffects
	}
	for _, s := range []Schedule{Duplicate, Lost, Concurrent} {
		require.Positive(t, damage[s], "the baseline shows what idem prevents under %s", s)
	}
	require.True(t, rep.OK())
}
