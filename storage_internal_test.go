package idem

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestFailedCommitFailsClosed makes the file's descriptor fail every write
// (it points at /dev/full, whose writes fail with ENOSPC, as a disk's do when
// the kernel could not write back a page): the commit that fails returns
// ErrStorageFailed with the cause, and from then on every call, replays
// included, fails closed with ErrStorageFailed: the engine no longer knows
// what the file holds. Close works, and a reopened engine answers from what
// reached the disk. It runs on bbolt's file (the journal off) and on the
// journal's segment.
func TestFailedCommitFailsClosed(t *testing.T) {
	for _, journal := range []bool{false, true} {
		t.Run(map[bool]string{false: "bbolt", true: "journal"}[journal], func(t *testing.T) {
			testFailedCommitFailsClosed(t, journal)
		})
	}
}

func testFailedCommitFailsClosed(t *testing.T, journal bool) {
	path := filepath.Join(t.TempDir(), "idem.db")
	f := &BoltOptions{JournalSize: -1}
	if journal {
		f = nil
	}
	e, err := OpenFile(path, f, &Options{PruneInterval: -1})
	require.NoError(t, err)
	ctx := context.Background()
	var ran atomic.Int64
	fn := func(context.Context) ([]byte, error) { ran.Add(1); return []byte("v"), nil }
	_, err = e.Do(ctx, "acked", nil, fn)
	require.NoError(t, err)

	target := path
	if journal {
		target = filepath.Join(journalDir(path), segmentName(1))
	}
	fd := fdOf(t, target)
	saved, err := syscall.Dup(fd)
	require.NoError(t, err)
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	require.NoError(t, err)
	require.NoError(t, syscall.Dup2(int(full.Fd()), fd))
	require.NoError(t, full.Close())

	_, err = e.Do(ctx, "lost", nil, fn)
	require.ErrorIs(t, err, ErrStorageFailed)
	require.ErrorIs(t, err, syscall.ENOSPC, "the cause is kept")
	require.EqualValues(t, 1, ran.Load(), "the started record did not commit: fn did not run")

	_, err = e.Do(ctx, "acked", nil, fn)
	require.ErrorIs(t, err, ErrStorageFailed, "a replay fails closed too")
	_, err = e.Get("acked")
	require.ErrorIs(t, err, ErrStorageFailed)
	_, err = e.Prune(ctx)
	require.ErrorIs(t, err, ErrStorageFailed)
	require.ErrorIs(t, e.Forget("acked"), ErrStorageFailed)

	require.NoError(t, syscall.Dup2(saved, fd), "the file comes back under the engine")
	require.NoError(t, syscall.Close(saved))
	require.NoError(t, e.Close())
	// Closed is closed, whatever failed before: every call says so.
	_, err = e.Do(ctx, "acked", nil, fn)
	require.ErrorIs(t, err, ErrClosed)
	require.NotErrorIs(t, err, ErrStorageFailed)
	_, err = e.DoTx(ctx, "acked", nil, func(context.Context, *Tx) ([]byte, error) { return nil, nil })
	require.ErrorIs(t, err, ErrClosed)
	_, err = e.Get("acked")
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, e.Forget("acked"), ErrClosed)
	_, err = e.Prune(ctx)
	require.ErrorIs(t, err, ErrClosed)

	e, err = OpenFile(path, f, &Options{PruneInterval: -1})
	require.NoError(t, err)
	defer e.Close()
	res, err := e.Do(ctx, "acked", nil, fn)
	require.NoError(t, err)
	require.True(t, res.Replayed, "the answer given before the failure is there after a reopen")
	res, err = e.Do(ctx, "lost", nil, fn)
	require.NoError(t, err)
	require.False(t, res.Replayed)
	require.EqualValues(t, 2, ran.Load())
}

// fdOf finds the descriptor this process holds on path.
func fdOf(t *testing.T, path string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	for _, ent := range ents {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", ent.Name())); err == nil && target == path {
			fd, err := strconv.Atoi(ent.Name())
			require.NoError(t, err)
			return fd
		}
	}
	t.Fatalf("no descriptor on %s", path)
	return -1
}
