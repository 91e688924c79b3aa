package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemmcp"

	"github.com/idemkit/idem/cmd/idem/internal/npmtest"
)

func TestMCPProxyUsageErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	readOnlyConfig := filepath.Join(dir, "read-only.yaml")
	require.NoError(t, os.WriteFile(readOnlyConfig, []byte("tools:\n  get_order: {readOnly: true}\n"), 0o600))
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
		{"empty meta key", []string{"mcp-proxy", "--meta-key", "", "--", "node"}, 2, "--meta-key must not be empty"},
		{"empty tool", []string{"mcp-proxy", "--tool", "", "--", "node"}, 2, `--tool: cannot protect the tool "": its name is empty`},
		{"tool read-only in the file", []string{"mcp-proxy", "--config", readOnlyConfig, "--tool", "get_order", "--", "node"}, 2,
			`--tool: cannot protect the tool "get_order": the configuration marks it readOnly`},
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

// TestMCPProxyMetaKeyAndToolFlags drives `idem mcp-proxy --meta-key NAME
// --tool NAME…` (this test binary, as TestMain runs it) in front of
// server-everything with the TypeScript SDK's client, which sends its keys
// under another _meta name. The file protects get-sum and lets unkeyed calls
// run; the flags add echo (read-only by its annotations, so relayed silently
// unless protected) and a tool the server does not have. The key is read
// under the flag's name only, both tools are protected, and the unknown tool
// is reported at tools/list.
func TestMCPProxyMetaKeyAndToolFlags(t *testing.T) {
	npm := npmtest.Dir(t)
	server := npmtest.Everything(t)
	dir := t.TempDir()
	db, cfg := filepath.Join(dir, "idem.db"), filepath.Join(dir, "proxy.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("tools:\n  get-sum: {}\nmissingKey: run\n"), 0o600))
	exe, err := os.Executable()
	require.NoError(t, err)
	const name = "com.example/request-id"
	args := append([]string{filepath.Join(npm, "client.mjs"), exe, "mcp-proxy", "--db", db, "--config", cfg,
		"--meta-key", name, "--tool", "echo", "--tool", "no-such-tool", "--"}, server...)
	cmd := exec.Command("node", args...)
	cmd.Env = append(os.Environ(), "IDEM_TS_META_KEY="+name)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "stderr: %s", stderr.String())
	var got struct {
		Tools       []string           `json:"tools"`
		Echo        string             `json:"echo"`
		First       mcpResult          `json:"first"`
		Second      mcpResult          `json:"second"`
		Conflict    struct{ Code int } `json:"conflict"`
		DefaultName []mcpResult        `json:"defaultName"`
	}
	require.NoError(t, json.Unmarshal(out, &got), "%s", out)
	require.Equal(t, "Echo: hi", got.Echo)

	// get-sum, protected by the file, under the flag's name.
	require.False(t, got.First.replayed())
	require.True(t, got.Second.replayed(), "the key under %q is read: the retry replays", name)
	require.JSONEq(t, string(got.First.Content), string(got.Second.Content))
	require.Equal(t, idemmcp.CodeConflict, got.Conflict.Code)
	// Idem's default name is not read: both calls are unkeyed and run.
	require.Len(t, got.DefaultName, 2)
	for _, r := range got.DefaultName {
		require.False(t, r.replayed())
	}
	errs := stderr.String()
	require.Contains(t, errs, `calls of "get-sum" without an idempotency key run unprotected`)
	// echo, protected by --tool: its unkeyed call is warned about.
	require.Contains(t, errs, `calls of "echo" without an idempotency key run unprotected`)
	// The tool the server does not list is reported, once; the others are not.
	require.Equal(t, 1, strings.Count(errs, `tool "no-such-tool" is in the configuration, but the server does not list it`), errs)
	require.NotContains(t, errs, `tool "get-sum" is in the configuration`)
	require.NotContains(t, errs, `tool "echo" is in the configuration`)

	r := idemDB(t, db, "get", "ts-sum-1")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "The sum of 4 and 5 is 9.")
	r = idemDB(t, db, "get", "ts-sum-2")
	require.Equal(t, 1, r.code, "no record under the key sent by the default name: %s", r.stdout)
}

// mcpResult is a tools/call result as the TypeScript client prints it.
type mcpResult struct {
	Content json.RawMessage            `json:"content"`
	Meta    map[string]json.RawMessage `json:"_meta"`
}

func (r mcpResult) replayed() bool { return string(r.Meta[idemmcp.MetaReplayed]) == "true" }
