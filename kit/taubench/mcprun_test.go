package taubench

import (
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/idemkit/idem/idemmcp"
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

// TestServeMCPRecovered: a tool server armed to crash in the call with a key
// dies of SIGKILL in it (after its commit), and a server restarted with the
// same configuration, as idem mcp-proxy restarts it, runs the call when its
// _meta says recovered: the effect is counted twice, and the key is marked
// in RecoveredBucket.
func TestServeMCPRecovered(t *testing.T) {
	dir := testDataDir(t)
	t.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	path := filepath.Join(t.TempDir(), "shop.db")
	require.NoError(t, SeedFile(path, dir))
	exe, err := os.Executable()
	require.NoError(t, err)
	sc := ServeConfig{DB: path, CrashKey: "intent-1", CrashPoint: MCPAfterCommit}
	args := map[string]any{"user_id": "mia_garcia_4516", "address1": "1 Main St", "address2": "", "city": "Austin",
		"state": "TX", "country": "USA", "zip": "78701"}
	call := func(recovered bool) (*mcp.CallToolResult, *exec.Cmd, error) {
		cmd, err := MCPServerCommand(exe, sc)
		require.NoError(t, err)
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil).
			Connect(t.Context(), &mcp.CommandTransport{Command: cmd}, nil)
		require.NoError(t, err)
		defer cs.Close()
		meta := mcp.Meta{idemmcp.MetaKey: "intent-1"}
		if recovered {
			meta[idemmcp.MetaRecovered] = true
		}
		res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Meta: meta, Name: "modify_user_address", Arguments: args})
		return res, cmd, err
	}

	_, cmd, err := call(false)
	require.Error(t, err, "the first execution is killed")
	ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
	require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "the server died of SIGKILL: %v", cmd.ProcessState)

	res, _, err := call(true)
	require.NoError(t, err, "the recovered call is not killed again")
	require.False(t, res.IsError)
	require.Contains(t, res.Content[0].(*mcp.TextContent).Text, "1 Main St")

	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true})
	require.NoError(t, err)
	defer db.Close()
	require.NoError(t, db.View(func(tx *bbolt.Tx) error {
		require.Equal(t, uint64(2), binary.BigEndian.Uint64(tx.Bucket([]byte(EffectsBucket)).Get([]byte("intent-1"))),
			"the first execution committed before it was killed; the recovered one ran again")
		require.NotNil(t, tx.Bucket([]byte(RecoveredBucket)).Get([]byte("intent-1")))
		return nil
	}))
}
