package main

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/kit/taubench"
)

// TestTaubenchViaMCP plays two tasks over MCP through the command, with the
// tool servers as children of the test binary (its init runs ChildMain).
func TestTaubenchViaMCP(t *testing.T) {
	data := taubench.DefaultDataDir(filepath.Join("..", ".."))
	r := idemCmd(t, nil, "", "taubench", "--via", "mcp", "--limit", "2", "--seed", "3", "--data", data)
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	for _, s := range taubench.Schedules {
		require.Contains(t, r.stdout, "| "+string(s)+" | idem | 2/2 | 0 | 0 |")
	}
	require.Contains(t, r.stdout, "--via=mcp")
}

func TestTaubenchViaUnknown(t *testing.T) {
	data := taubench.DefaultDataDir(filepath.Join("..", ".."))
	r := idemCmd(t, nil, "", "taubench", "--via", "carrier-pigeon", "--data", data)
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, `--via must be direct or mcp, not "carrier-pigeon"`)
}
