package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// A key with a NUL, which an earlier version could store
// (../../testdata/legacy-keys.db holds "\x00"), cannot be given to the tool
// as an argument: the operating system ends every argument at NUL, so
// TestKeysStoredBeforeTheKeyRules reached it only in-process. With --quoted,
// get, forget and resolve take KEY Go-quoted, as ls prints it.
func TestQuotedKeyReachesKeysNoArgumentCanCarry(t *testing.T) {
	require.Error(t, exec.Command(os.Args[0], "-test.run=^$", "\x00").Run(),
		"a NUL in an argument is refused by the OS: the key needs another spelling")

	path := copyFixture(t, filepath.Join("..", "..", "testdata", "legacy-keys.db"))

	ls := idemDB(t, path, "ls")
	require.Equal(t, 0, ls.code, ls.stderr)
	require.Contains(t, ls.stdout, `"\x00"`, "ls prints the key Go-quoted")

	r := idemDB(t, path, "get", "--quoted", `"\x00"`)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "done")
	r = idemDB(t, path, "resolve", "--quoted", `"\ufeff"`, "--response", "resolved")
	require.Equal(t, 0, r.code, r.stderr)
	r = idemDB(t, path, "get", "--quoted", `"\ufeff"`, "--raw")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, "resolved", r.stdout)
	r = idemDB(t, path, "forget", "--quoted", `"\x00"`)
	require.Equal(t, 0, r.code, r.stderr)
	r = idemDB(t, path, "get", "--quoted", `"\x00"`)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "not found")

	// Without --quoted the argument is the key as given; a bad quoting is a
	// usage error.
	r = idemDB(t, path, "get", `"\x00"`)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "not found")
	r = idemDB(t, path, "get", "--quoted", `"\x0`)
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "not a Go-quoted string")
}
