package robustness

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit/boltkit"
)

// sentinels are the errors a child reports its error matches, by name.
var sentinels = map[string]error{
	"ErrFormat": idem.ErrFormat, "ErrCorrupt": idem.ErrCorrupt, "ErrStorageFailed": idem.ErrStorageFailed,
	"ErrFileFull": idem.ErrFileFull, "ErrDatabaseReadOnly": bolterrors.ErrDatabaseReadOnly,
	"ErrTimeout": bolterrors.ErrTimeout, "EACCES": syscall.EACCES, "EROFS": syscall.EROFS,
	"ENOSPC": syscall.ENOSPC, "EISDIR": syscall.EISDIR,
}

func printSentinels(err error) {
	for name, s := range sentinels {
		if errors.Is(err, s) {
			fmt.Println("is:" + name)
		}
	}
}

// mountTmpfs mounts a tmpfs of size bytes at a new directory (root only).
func mountTmpfs(t *testing.T, size int) string {
	t.Helper()
	needRoot(t)
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d,mode=0755", size)); err != nil {
		unavailable(t, "mount tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// TestDiskFull fills a 2 MiB tmpfs: the commit that finds no space fails
// with ErrStorageFailed wrapping ENOSPC (a full disk is a failed write: the
// engine fails closed), no panic, and after a reopen every answer given
// replays; on the still-full disk new calls fail cleanly and replays work,
// and once space is freed (the ballast removed, the disk grown) new calls
// work again.
func TestDiskFull(t *testing.T) {
	dir := mountTmpfs(t, 2<<20)
	ballast := filepath.Join(dir, "ballast")
	path := filepath.Join(dir, "idem.db")
	ctx := context.Background()
	e, err := idem.Open(path, &idem.Options{PruneInterval: -1})
	require.NoError(t, err)
	resp := bytes.Repeat([]byte("x"), 3000)
	fn := func(context.Context) ([]byte, error) { return resp, nil }
	var acked []string
	for i := 0; ; i++ {
		k := fmt.Sprintf("k%05d", i)
		if _, err = e.Do(ctx, k, nil, fn); err != nil {
			break
		}
		acked = append(acked, k)
		require.Less(t, i, 100000, "the disk never filled")
	}
	require.ErrorIs(t, err, idem.ErrStorageFailed)
	require.ErrorIs(t, err, syscall.ENOSPC)
	require.NotEmpty(t, acked)
	_, err = e.Do(ctx, acked[0], nil, fn)
	require.ErrorIs(t, err, idem.ErrStorageFailed, "failed closed")
	_ = e.Close()

	boltkit.Check(t, path)
	e, err = idem.Open(path, &idem.Options{PruneInterval: -1})
	require.NoError(t, err, "a full disk does not stop a reopen")
	for _, k := range acked {
		res, err := e.Do(ctx, k, nil, mustNotRun(t))
		require.NoError(t, err)
		require.True(t, res.Replayed)
		require.Equal(t, resp, res.Response)
	}
	// Fill what is left with ballast, so that the next commit finds no space.
	b, err := os.Create(ballast)
	require.NoError(t, err)
	for {
		if _, err := b.Write(make([]byte, 4096)); err != nil {
			break
		}
	}
	require.NoError(t, b.Close())
	for i := 0; err == nil; i++ {
		_, err = e.Do(ctx, fmt.Sprintf("more-%d", i), nil, fn)
		require.Less(t, i, 100000, "the disk never filled")
	}
	require.ErrorIs(t, err, idem.ErrStorageFailed)
	_ = e.Close()
	require.NoError(t, os.Remove(ballast))
	// The file grows in doubling steps: give the disk room for the next.
	require.NoError(t, syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_REMOUNT, "size=16m"))
	boltkit.Check(t, path)
	e, err = idem.Open(path, &idem.Options{PruneInterval: -1})
	require.NoError(t, err)
	defer e.Close()
	_, err = e.Do(ctx, "after-space-freed", nil, fn)
	require.NoError(t, err, "works again once there is space")
	res, err := e.Do(ctx, acked[len(acked)-1], nil, mustNotRun(t))
	require.NoError(t, err)
	require.True(t, res.Replayed)
}

func mustNotRun(t *testing.T) func(context.Context) ([]byte, error) {
	return func(context.Context) ([]byte, error) {
		t.Errorf("fn ran for a key that has an answer")
		return nil, nil
	}
}

// TestDamagedFiles opens files that are not an idem file as they should be:
// random bytes, a real file cut short, an empty file, a directory. Each
// gives a clear error (or, for an empty file opened to write, a new file:
// nothing was stored in it), never a panic, read-only or not.
func TestDamagedFiles(t *testing.T) {
	ctx := context.Background()
	valid := func(t *testing.T, path string) {
		e, err := idem.OpenFile(path, &idem.BoltOptions{NoSync: true}, &idem.Options{PruneInterval: -1})
		require.NoError(t, err)
		for i := range 600 {
			_, err := e.Do(ctx, fmt.Sprintf("k%d", i), nil, func(context.Context) ([]byte, error) { return bytes.Repeat([]byte("v"), 100), nil })
			require.NoError(t, err)
		}
		require.NoError(t, e.Close())
	}
	for _, tc := range []struct {
		name  string
		make  func(t *testing.T, path string)
		check func(t *testing.T, err error, readOnly bool)
	}{
		{"random bytes", func(t *testing.T, path string) {
			b := make([]byte, 64<<10)
			for i := range b {
				b[i] = byte(i*7919 + i>>3)
			}
			require.NoError(t, os.WriteFile(path, b, 0o600))
		}, func(t *testing.T, err error, _ bool) {
			require.ErrorIs(t, err, idem.ErrFormat, "not an idem file")
			require.ErrorIs(t, err, bolterrors.ErrInvalid, "bbolt's invalid-file error, wrapped")
		}},
		{"cut short", func(t *testing.T, path string) {
			valid(t, path)
			fi, err := os.Stat(path)
			require.NoError(t, err)
			require.NoError(t, os.Truncate(path, fi.Size()/3))
		}, func(t *testing.T, err error, _ bool) {
			require.ErrorIs(t, err, idem.ErrCorrupt)
		}},
		{"cut to its meta pages", func(t *testing.T, path string) {
			valid(t, path)
			require.NoError(t, os.Truncate(path, 2*int64(os.Getpagesize())))
		}, func(t *testing.T, err error, _ bool) {
			require.ErrorIs(t, err, idem.ErrCorrupt)
		}},
		{"zero length", func(t *testing.T, path string) {
			require.NoError(t, os.WriteFile(path, nil, 0o600))
		}, func(t *testing.T, err error, readOnly bool) {
			if readOnly {
				require.ErrorIs(t, err, idem.ErrFormat)
			} else {
				require.NoError(t, err, "an empty file holds nothing: it becomes a new idem file")
			}
		}},
		{"a directory", func(t *testing.T, path string) {
			require.NoError(t, os.Mkdir(path, 0o755))
		}, func(t *testing.T, err error, _ bool) {
			require.ErrorIs(t, err, syscall.EISDIR)
		}},
	} {
		for _, ro := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/readonly=%t", tc.name, ro), func(t *testing.T) {
				path := filepath.Join(t.TempDir(), "idem.db")
				tc.make(t, path)
				e, err := idem.OpenFile(path, &idem.BoltOptions{ReadOnly: ro}, &idem.Options{PruneInterval: -1})
				t.Logf("open: %v", err)
				if err != nil {
					var op *idem.OpError
					require.ErrorAs(t, err, &op, "the error names the operation and the file")
					require.Equal(t, path, op.Path)
				}
				tc.check(t, err, ro)
				if e != nil {
					_, err := e.Do(ctx, "k", nil, func(context.Context) ([]byte, error) { return nil, nil })
					if ro {
						require.Error(t, err)
					} else {
						require.NoError(t, err)
					}
					require.NoError(t, e.Close())
				}
			})
		}
	}
}

// TestLockedByAnotherProcess: while a child process holds the file, Open
// gives up after LockTimeout with bbolt's ErrTimeout and says why; once the
// child dies (SIGKILL: the kernel drops its lock), Open works.
func TestLockedByAnotherProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	cmd := child(t, "hold", "IDEM_DB="+path)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "held\n", line)

	_, err = idem.OpenFile(path, &idem.BoltOptions{LockTimeout: 100 * time.Millisecond}, nil)
	require.ErrorIs(t, err, bolterrors.ErrTimeout)
	require.ErrorContains(t, err, "in use by another program")
	_, err = idem.OpenFile(path, &idem.BoltOptions{ReadOnly: true, LockTimeout: 100 * time.Millisecond}, nil)
	require.ErrorIs(t, err, bolterrors.ErrTimeout, "a reader waits for the writer too")

	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	e, err := idem.OpenFile(path, &idem.BoltOptions{LockTimeout: time.Second}, nil)
	require.NoError(t, err)
	require.NoError(t, e.Close())
}

// TestReadOnlyMount remounts a tmpfs read-only under a file with answers:
// opening it to write fails with EROFS (no panic, nothing changed); opened
// ReadOnly it replays every answer and refuses new calls with bbolt's
// ErrDatabaseReadOnly.
func TestReadOnlyMount(t *testing.T) {
	dir := mountTmpfs(t, 8<<20)
	path := filepath.Join(dir, "idem.db")
	ctx := context.Background()
	e, err := idem.Open(path, &idem.Options{PruneInterval: -1})
	require.NoError(t, err)
	for i := range 50 {
		_, err := e.Do(ctx, fmt.Sprintf("k%d", i), nil, func(context.Context) ([]byte, error) { return []byte("v"), nil })
		require.NoError(t, err)
	}
	require.NoError(t, e.Close())
	require.NoError(t, syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_REMOUNT|syscall.MS_RDONLY, ""))
	defer func() { _ = syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_REMOUNT, "") }()

	_, err = idem.Open(path, nil)
	require.ErrorIs(t, err, syscall.EROFS)
	e, err = idem.OpenFile(path, &idem.BoltOptions{ReadOnly: true}, nil)
	require.NoError(t, err)
	defer e.Close()
	for i := range 50 {
		res, err := e.Do(ctx, fmt.Sprintf("k%d", i), nil, mustNotRun(t))
		require.NoError(t, err)
		require.True(t, res.Replayed)
	}
	_, err = e.Do(ctx, "new", nil, mustNotRun(t))
	require.ErrorIs(t, err, bolterrors.ErrDatabaseReadOnly)
}

// TestChildAsNobody runs a child as the user nobody against files root
// owns (file modes do not stop root itself): a 0600 file is EACCES to open,
// to write or to read; a 0644 file opens ReadOnly and replays, and refuses
// to write (ErrDatabaseReadOnly), and opening it to write is EACCES.
func TestChildAsNobody(t *testing.T) {
	needRoot(t)
	dir, err := os.MkdirTemp("", "idem-nobody-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	// The test binary may sit in a directory nobody cannot enter: copy it.
	exe, err := os.Executable()
	require.NoError(t, err)
	bin, err := os.ReadFile(exe)
	require.NoError(t, err)
	nobodyExe := filepath.Join(dir, "robustness.test")
	require.NoError(t, os.WriteFile(nobodyExe, bin, 0o755))

	path := filepath.Join(dir, "idem.db")
	e, err := idem.Open(path, &idem.Options{PruneInterval: -1})
	require.NoError(t, err)
	_, err = e.Do(context.Background(), "child", nil, func(context.Context) ([]byte, error) { return []byte("x"), nil })
	require.NoError(t, err)
	require.NoError(t, e.Close())
	before, err := os.ReadFile(path)
	require.NoError(t, err)

	run := func(mode os.FileMode, readOnly bool) string {
		require.NoError(t, os.Chmod(path, mode))
		cmd := exec.Command(nobodyExe)
		cmd.Env = append(os.Environ(), envChild+"=open", "IDEM_DB="+path)
		if readOnly {
			cmd.Env = append(cmd.Env, "IDEM_READONLY=1")
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		return string(out)
	}
	require.Contains(t, run(0o600, false), "is:EACCES")
	require.Contains(t, run(0o600, true), "is:EACCES")
	require.Contains(t, run(0o644, false), "is:EACCES")
	out := run(0o644, true)
	require.Contains(t, out, "child: ok replayed=true\n", "the answer replays")
	require.Contains(t, out, "child-new: ", "the new call fails")
	require.Contains(t, out, "is:ErrDatabaseReadOnly")
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, before, after, "nobody changed nothing")
}
