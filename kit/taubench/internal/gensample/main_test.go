package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/kit/taubench"
)

// TestSampleIsGenerated: the committed sample (kit/taubench/sample, which
// the package embeds) is byte for byte what this generator writes now, its
// reference outputs those of a fault-free run of today's tools. A change to a
// tool's answers, or to the generator, fails here until `go generate
// ./kit/taubench` is run again and its output committed.
func TestSampleIsGenerated(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, generate(dir))
	for _, name := range []string{taubench.OrdersFile, taubench.UsersFile, taubench.ProductsFile, taubench.TasksFile} {
		want, err := os.ReadFile(filepath.Join(dir, name))
		require.NoError(t, err)
		got, err := os.ReadFile(filepath.Join("..", "..", "sample", name))
		require.NoError(t, err)
		require.True(t, string(want) == string(got), "sample/%s is not what the generator writes: run go generate ./kit/taubench", name)
	}
}
