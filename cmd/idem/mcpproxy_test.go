package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/cmd/idem/internal/npmtest"
)

func TestMCPProxyUsageErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, tt := range []struct {
		name       string
		args       []string
		code       int
		wantStderr string
	}{
		{"no command", []string{"mcp-proxy"}, 2, "requires at least 1 arg(s)"},
		{"command before --", []string{"mcp-proxy", "node", "server.js"}, 2, "put the server's command after --"},
		{"bad in-flight policy", []string{"mcp-proxy", "--in-flight", "maybe", "--", "node"}, 2, `--in-flight must be wait or fail, not "maybe"`},
		{"bad max-wait", []string{"mcp-proxy", "--max-wait", "0s", "--", "node"}, 2, "--max-wait must be positive, not 0s"},
		{"missing config", []string{"mcp-proxy", "--config", filepath.Join(dir, "none.yaml"), "--", "node"}, 1, "none.yaml"},
		{"no such server", []string{"mcp-proxy", "--", filepath.Join(dir, "no-such-server")}, 1, "starting the server"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := idemCmd(t, nil, "", append([]string{"--db", filepath.Join(t.TempDir(), "idem.db")}, tt.args...)...)
			require.Equal(t, tt.code, r.code, r.stderr)
			require.Contains(t, r.stderr, tt.wantStderr)
			require.Empty(t, r.stdout, "stdout is the MCP session's")
		})
	}
}

// TestMCPProxyCommand runs `idem mcp-proxy` in front of server-everything
// with a client script on stdin: of two calls with one key, one runs and the
// other replays under its own id, and the record is in the --db file for
// `idem get`.
func TestMCPProxyCommand(t *testing.T) {
	server := npmtest.Everything(t)
	dir := t.TempDir()
	db, cfg := filepath.Join(dir, "idem.db"), filepath.Join(dir, "proxy.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("tools:\n  get-sum: {}\n"), 0o600))
	script := strings.Join([]string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"cli-test","version":"1"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"get-sum","arguments":{"a":1,"b":2},"_meta":{"io.github.idemkit/idempotency-key":"sum-1"}}}`,
		`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"get-sum","arguments":{"b":2,"a":1},"_meta":{"io.github.idemkit/idempotency-key":"sum-1"}}}`,
	}, "\n") + "\n"
	args := append([]string{"--db", db, "mcp-proxy", "--config", cfg, "--"}, server...)
	r := idemCmd(t, nil, script, args...)
	require.Equal(t, 0, r.code, r.stderr)

	results := map[string]map[string]json.RawMessage{}
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		var m struct {
			ID     json.RawMessage            `json:"id"`
			Method string                     `json:"method"`
			Result map[string]json.RawMessage `json:"result"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &m), line)
		if m.Method == "" {
			results[string(m.ID)] = m.Result
		}
	}
	require.Len(t, results, 3, r.stdout)
	require.JSONEq(t, string(results["2"]["content"]), string(results["3"]["content"]))
	// The two calls arrive together: one runs, the other waits for it and
	// answers as a replay.
	first, second := results["2"], results["3"]
	if _, ok := first["_meta"]; ok {
		first, second = second, first
	}
	require.NotContains(t, first, "_meta")
	require.JSONEq(t, `{"io.github.idemkit/replayed":true}`, string(second["_meta"]))

	got := idemDB(t, db, "get", "sum-1")
	require.Equal(t, 0, got.code, got.stderr)
	require.Contains(t, got.stdout, "The sum of 1 and 2 is 3.")
}
