package idem_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// damagedFile writes a healthy idem file holding a few records and returns
// its path and bytes, for tests that damage it and later repair it.
func damagedFile(t *testing.T) (string, []byte) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "idem.db")
	e, err := idem.OpenFile(path, &idem.BoltOptions{NoSync: true}, &idem.Options{PruneInterval: -1})
	require.NoError(t, err)
	for i := range 200 {
		_, err := e.Do(bg, fmt.Sprintf("order-%d", i), nil, okFn(strings.Repeat("x", 200)))
		require.NoError(t, err)
	}
	require.NoError(t, e.Close())
	good, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Greater(t, len(good), 16<<10, "a file of more than 16 KiB, so that truncating it loses pages")
	return path, good
}

// boltMeta reads the newer meta page of a healthy bbolt file (bbolt's
// layout: a 16-byte page header, then magic, version, page size, flags, the
// root bucket, the freelist page, the high water mark, the txid): the page
// size, the freelist's page and the bytes of the pages in use.
func boltMeta(b []byte) (pageSize, freelist, inUse uint64) {
	pageSize, _, freelist, inUse = boltMetaRoot(b)
	return pageSize, freelist, inUse
}

// boltMetaRoot is boltMeta with the page of the root bucket's tree.
func boltMetaRoot(b []byte) (pageSize, root, freelist, inUse uint64) {
	le := binary.LittleEndian
	pageSize = uint64(le.Uint32(b[16+8:]))
	m := b[16:]
	if m1 := b[pageSize+16:]; le.Uint64(m1[48:]) > le.Uint64(m[48:]) {
		m = m1
	}
	return pageSize, le.Uint64(m[16:]), le.Uint64(m[32:]), le.Uint64(m[40:]) * pageSize
}

// fdCount counts this process's open file descriptors.
func fdCount(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	return len(ents)
}

// A failed Open must give back the file (its descriptor and its lock): bbolt
// panics on some damage after it took the lock, and the engine turns the panic
// into an error. After 50 failed Opens the descriptor count is unchanged and
// the repaired file opens, in this process, at once.
func TestFailedOpenReleasesTheFile(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(good []byte) []byte
	}{
		{"truncated to 8 KiB", func(good []byte) []byte { return good[:8<<10] }},
		{"freelist page of another type", func(good []byte) []byte {
			// Meta pages intact and in the file: only bbolt's own read of
			// the freelist finds the damage (it panics).
			b := append([]byte(nil), good...)
			ps, fl, _ := boltMeta(b)
			binary.LittleEndian.PutUint16(b[fl*ps+8:], 0x01) // a branch page's flag
			return b
		}},
		{"root page of another id", func(good []byte) []byte {
			// bbolt opens the file; the engine's first transaction reads
			// the root page, and bbolt panics on its check of the page.
			b := append([]byte(nil), good...)
			ps, root, _, _ := boltMetaRoot(b)
			binary.LittleEndian.PutUint64(b[root*ps:], 0xdead)
			return b
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, good := damagedFile(t)
			require.NoError(t, os.WriteFile(path, tc.damage(good), 0o600))
			before := fdCount(t)
			for range 50 {
				_, err := idem.OpenFile(path, &idem.BoltOptions{LockTimeout: 50 * time.Millisecond}, &idem.Options{PruneInterval: -1})
				require.ErrorIs(t, err, idem.ErrCorrupt)
				require.NotContains(t, err.Error(), "in use", "the failed Open before this one left the lock behind")
			}
			require.Equal(t, before, fdCount(t), "50 failed Opens leak no descriptor")

			require.NoError(t, os.WriteFile(path, good, 0o600)) // restored from a backup
			e, err := idem.Open(path, &idem.Options{PruneInterval: -1})
			require.NoError(t, err, "the repaired file opens")
			defer e.Close()
			res, err := e.Do(bg, "order-7", nil, mustNotRun(t))
			require.NoError(t, err)
			require.True(t, res.Replayed)
		})
	}
}

const envOpenChild = "IDEM_TEST_OPEN_CHILD"

// A file truncated below its last page must be an error from every Open,
// read-only too, never a signal: bbolt maps the whole file and faults
// (SIGBUS) on the pages past its end, which no recover catches, so the test
// opens it in a child process and checks how the child ended.
//
// A file whose freelist claims more than its pages faults the same way in a
// read-write Open (bbolt reads the freelist through the map).
func TestOpenOfTruncatedFileIsAnErrorNotASignal(t *testing.T) {
	if path := os.Getenv(envOpenChild); path != "" {
		_, err := idem.OpenFile(path, &idem.BoltOptions{ReadOnly: os.Getenv(envOpenChild+"_RO") != ""}, &idem.Options{PruneInterval: -1})
		fmt.Printf("corrupt=%v err=%v\n", errors.Is(err, idem.ErrCorrupt), err)
		os.Exit(0)
	}
	for _, tc := range []struct {
		name     string
		readOnly bool
		size     int
		damage   func(b []byte) // besides the truncation, if any
	}{
		{"read-only, 8 KiB", true, 8 << 10, nil},
		{"read-only, last page in use cut", true, -4096, nil},
		{"read-only, meta page cut", true, 4096 + 100, nil},
		{"read-write, 8 KiB", false, 8 << 10, nil},
		{"read-write, last page in use cut", false, -4096, nil},
		{"read-write, freelist longer than the file", false, 0, func(b []byte) {
			// bbolt reads a freelist's ids through the map, as many as its
			// count says: a count past the file faults.
			ps, fl, _ := boltMeta(b)
			binary.LittleEndian.PutUint16(b[fl*ps+10:], 0xFFFF)
			binary.LittleEndian.PutUint64(b[fl*ps+16:], 1<<40)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, good := damagedFile(t)
			size := tc.size
			if _, _, inUse := boltMeta(good); size < 0 {
				size += int(inUse)
			}
			if tc.damage != nil {
				b := append([]byte(nil), good...)
				tc.damage(b)
				require.NoError(t, os.WriteFile(path, b, 0o600))
			}
			if size != 0 {
				require.NoError(t, os.Truncate(path, int64(size)))
			}
			cmd := exec.Command(os.Args[0], "-test.run=^TestOpenOfTruncatedFileIsAnErrorNotASignal$")
			cmd.Env = append(os.Environ(), envOpenChild+"="+path)
			if tc.readOnly {
				cmd.Env = append(cmd.Env, envOpenChild+"_RO=1")
			}
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if errors.As(err, &exit) {
				ws, _ := exit.Sys().(syscall.WaitStatus)
				require.False(t, ws.Signaled(), "the child died of %v:\n%s", ws.Signal(), lastLines(out))
			}
			require.NoError(t, err, "%s", lastLines(out))
			require.Contains(t, string(out), "corrupt=true", "the error wraps ErrCorrupt")
			require.Regexp(t, "truncated|freelist", string(out))
		})
	}
}

// lastLines keeps a child's output readable: a fatal fault prints every
// goroutine's stack.
func lastLines(out []byte) string {
	lines := strings.Split(string(out), "\n")
	if len(lines) > 12 {
		lines = lines[:12]
	}
	return strings.Join(lines, "\n")
}
