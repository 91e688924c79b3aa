package idemcore_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestNoStorageDriverAboveTheSeam: the core names no storage driver, and
// the Postgres backend and the adapters import the core, never the bbolt
// engine, so `go list -deps` of them names no bbolt (and of the adapters no
// pgx either). .ci/run checks the same.
func TestNoStorageDriverAboveTheSeam(t *testing.T) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("no source path")
	}
	root := filepath.Dir(filepath.Dir(file))
	if _, err := os.Stat(filepath.Join(root, "go.work")); err != nil {
		t.Skip("not in the repository's workspace (go.work): the other modules are not here")
	}
	const bbolt, pgx = "go.etcd.io/bbolt", "github.com/jackc/pgx"
	for pkg, banned := range map[string][]string{
		"./idemcore": {bbolt, pgx},
		"./idempg":   {bbolt},
		"./idemhttp": {bbolt, pgx},
		"./idemmcp":  {bbolt, pgx},
		"./idemprom": {bbolt, pgx},
		"./idemotel": {bbolt, pgx},
	} {
		cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "list", "-deps", pkg)
		cmd.Dir = root
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		for _, dep := range strings.Fields(string(out)) {
			for _, b := range banned {
				if dep == b || strings.HasPrefix(dep, b+"/") {
					t.Errorf("%s depends on %s", pkg, dep)
				}
			}
		}
	}
}
