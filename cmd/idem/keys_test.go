package main

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestKeysStoredBeforeTheKeyRules: the tool reaches records stored under keys
// that Do now refuses (white space at the ends, invisible characters);
// ../../testdata/legacy-keys.db was written before the rules changed (see
// the root's key_test.go).
func TestKeysStoredBeforeTheKeyRules(t *testing.T) {
	path := copyFixture(t, filepath.Join("..", "..", "testdata", "legacy-keys.db"))

	r := idemDB(t, path, "get", " k ")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, `stored under " k "`)
	r = idemDB(t, path, "get", "\x00")
	require.Equal(t, 0, r.code, r.stderr)

	r = idemDB(t, path, "resolve", "\ufeff", "--response", "resolved")
	require.Equal(t, 0, r.code, r.stderr)
	r = idemDB(t, path, "get", "\ufeff")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "resolved")

	r = idemDB(t, path, "forget", "\t\n")
	require.Equal(t, 0, r.code, r.stderr)
	r = idemDB(t, path, "get", "\t\n")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "not found")
}
