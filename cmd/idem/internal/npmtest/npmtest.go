// Package npmtest finds, for tests, the npm packages pinned in
// cmd/idem/testdata/npm: a real MCP server (@modelcontextprotocol/server-everything)
// and the TypeScript SDK (@modelcontextprotocol/sdk). .ci/run installs them
// with npm ci; by hand:
//
//	cd cmd/idem/testdata/npm && npm ci
//
// Without them a test is skipped with that hint, except under CI (the CI
// environment variable set), where it fails: CI must not pass by skipping.
package npmtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// Dir returns the absolute path of cmd/idem/testdata/npm, after checking that
// node and the installed packages are there (else t.Skip, or t.Fatal under CI).
func Dir(t testing.TB) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	dir := filepath.Join(filepath.Dir(file), "..", "..", "testdata", "npm")
	missing := ""
	if _, err := exec.LookPath("node"); err != nil {
		missing = "node is not in PATH"
	}
	for _, p := range []string{
		"node_modules/@modelcontextprotocol/server-everything/dist/index.js",
		"node_modules/@modelcontextprotocol/sdk/package.json",
	} {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil && missing == "" {
			missing = p + " is missing"
		}
	}
	if missing != "" {
		msg := missing + ": install the test's npm packages with: cd " + dir + " && npm ci"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return dir
}

// Everything returns the argv of @modelcontextprotocol/server-everything over
// stdio.
func Everything(t testing.TB) []string {
	t.Helper()
	return []string{"node", filepath.Join(Dir(t), "node_modules/@modelcontextprotocol/server-everything/dist/index.js"), "stdio"}
}
