package mcpproxy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseConfig(t *testing.T) {
	want := &Config{
		Tools: map[string]Tool{
			"create_order": {},
			"cancel_order": {KeyArgs: []string{"order_id"}},
			"get_order":    {ReadOnly: true},
		},
		MissingKey: MissingKeyRun,
	}
	yaml := "tools:\n  create_order: {}\n  cancel_order: {keyArgs: [order_id]}\n  get_order: {readOnly: true}\nmissingKey: run\n"
	json := `{"tools":{"create_order":{},"cancel_order":{"keyArgs":["order_id"]},"get_order":{"readOnly":true}},"missingKey":"run"}`
	for _, in := range []string{yaml, json} {
		c, err := ParseConfig([]byte(in))
		require.NoError(t, err)
		require.Equal(t, want, c)
	}
	c, err := ParseConfig(nil)
	require.NoError(t, err)
	require.Equal(t, &Config{}, c, "empty input protects nothing")
}

func TestParseConfigErrors(t *testing.T) {
	for _, tc := range []struct{ in, err string }{
		{"tools:\n  a: {readonly: true}\n", "field readonly not found"},
		{"missingKey: maybe\n", `missingKey must be "refuse" or "run", not "maybe"`},
		{"tools:\n  a: {readOnly: true, keyArgs: [x]}\n", "readOnly and keyArgs exclude each other"},
		{"tools:\n  " + strings.Repeat("n", 65) + ": {keyArgs: [x]}\n", "keyArgs needs a name of at most 64 bytes"},
		{"tools:\n  '': {}\n", "a tool with an empty name"},
		{"tools: [a, b]\n", "cannot unmarshal"},
	} {
		_, err := ParseConfig([]byte(tc.in))
		require.ErrorContains(t, err, tc.err, "%q", tc.in)
	}
}

func TestLoadConfigNamesTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "proxy.yaml")
	require.NoError(t, os.WriteFile(path, []byte("missingKey: x\n"), 0o600))
	_, err := LoadConfig(path)
	require.ErrorContains(t, err, path)
	_, err = LoadConfig(filepath.Join(t.TempDir(), "missing.yaml"))
	require.ErrorContains(t, err, "missing.yaml")
}

// TestConfigProtect: --tool's Protect adds a tool with the key from _meta,
// keeps a protected tool's entry, and refuses an empty name and a read-only
// tool, leaving the configuration as it was; KeyName is the file's metaKey or
// idem's name.
func TestConfigProtect(t *testing.T) {
	c, err := ParseConfig([]byte("tools:\n  cancel_order: {keyArgs: [order_id]}\n  get_order: {readOnly: true}\nmetaKey: com.example/request-id\n"))
	require.NoError(t, err)
	require.Equal(t, "com.example/request-id", c.KeyName())
	require.NoError(t, c.Protect("create_order"))
	require.NoError(t, c.Protect("cancel_order"))
	require.ErrorIs(t, c.Protect("get_order"), ErrBadTool)
	require.ErrorIs(t, c.Protect(""), ErrBadTool)
	require.Equal(t, map[string]Tool{
		"create_order": {},
		"cancel_order": {KeyArgs: []string{"order_id"}},
		"get_order":    {ReadOnly: true},
	}, c.Tools)

	empty := &Config{}
	require.Equal(t, MetaKey, empty.KeyName())
	require.NoError(t, empty.Protect("create_order"))
	require.Equal(t, map[string]Tool{"create_order": {}}, empty.Tools)
}
