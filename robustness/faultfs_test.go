package robustness

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// faultFS is a loopback FUSE file system over a directory of the test's own
// that fails writes or fsyncs on command (EIO) and remembers, per file, what
// every write since the file's last fsync overwrote, so that powerCut can
// drop those writes as a machine's power failure drops the pages the kernel
// had not written back.
type faultFS struct {
	under, mnt string
	server     *fuse.Server

	mu          sync.Mutex
	failWrites  bool
	failFsyncs  bool
	syncDelay   time.Duration     // each fsync takes this long: kills land mid-commit
	undo        map[string][]undo // by path under `under`: oldest first
	writes      int
	fsyncs      int
	failedCalls int
}

// undo is what one write or truncate changed: the bytes it overwrote at off
// (beyond the old end of the file: nothing) and the file's size before it.
type undo struct {
	off  int64
	old  []byte
	size int64
}

// mountFaultFS mounts a faultFS at a new directory, or skips the test when
// FUSE is not available here (no /dev/fuse, not root); under CI it fails
// instead, so that the tests cannot silently stop running where they can run.
func mountFaultFS(t *testing.T) *faultFS {
	t.Helper()
	needRoot(t)
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("skipped: no /dev/fuse: %v", err)
	}
	dir := t.TempDir()
	f := &faultFS{under: filepath.Join(dir, "under"), mnt: filepath.Join(dir, "mnt"), undo: map[string][]undo{}}
	for _, d := range []string{f.under, f.mnt} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	root := &fs.LoopbackRoot{Path: f.under}
	root.NewNode = func(r *fs.LoopbackRoot, _ *fs.Inode, _ string, _ *syscall.Stat_t) fs.InodeEmbedder {
		return &faultNode{LoopbackNode: fs.LoopbackNode{RootData: r}, ffs: f}
	}
	var st syscall.Stat_t
	if err := syscall.Stat(f.under, &st); err != nil {
		t.Fatal(err)
	}
	root.Dev = uint64(st.Dev)
	root.RootNode = root.NewNode(root, nil, "", &st)
	server, err := fs.Mount(f.mnt, root.RootNode, &fs.Options{MountOptions: fuse.MountOptions{
		DirectMount: true, FsName: "idem-faultfs", Name: "faultfs", AllowOther: true,
	}})
	if err != nil {
		unavailable(t, "cannot mount FUSE: %v", err)
	}
	f.server = server
	t.Cleanup(func() { f.unmount(t) })
	return f
}

func (f *faultFS) unmount(t *testing.T) {
	if f.server == nil {
		return
	}
	if err := f.server.Unmount(); err != nil {
		t.Errorf("unmount %s: %v", f.mnt, err)
		if err := syscall.Unmount(f.mnt, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount -l %s: %v", f.mnt, err)
		}
	}
	f.server.Wait()
	f.server = nil
}

// set turns the failure of writes and of fsyncs on or off.
func (f *faultFS) set(writes, fsyncs bool) {
	f.mu.Lock()
	f.failWrites, f.failFsyncs = writes, fsyncs
	f.mu.Unlock()
}

// powerCut unmounts the file system (after the processes using it died) and
// drops the unsynced writes of every file: all of them, or, with torn, only
// the ones after a random point (the disk wrote the earlier ones back, in
// order). It returns how many writes it dropped.
func (f *faultFS) powerCut(t *testing.T, r *rand.Rand, torn bool) int {
	t.Helper()
	f.unmount(t)
	f.mu.Lock()
	defer f.mu.Unlock()
	dropped := 0
	for rel, us := range f.undo {
		from := 0
		if torn && len(us) > 0 {
			from = r.IntN(len(us) + 1)
		}
		file, err := os.OpenFile(filepath.Join(f.under, rel), os.O_RDWR, 0)
		if err != nil {
			t.Fatalf("power cut: %v", err)
		}
		for i := len(us) - 1; i >= from; i-- {
			u := us[i]
			if _, err := file.WriteAt(u.old, u.off); err != nil {
				t.Fatalf("power cut: %v", err)
			}
			if err := file.Truncate(u.size); err != nil {
				t.Fatalf("power cut: %v", err)
			}
			dropped++
		}
		if err := file.Close(); err != nil {
			t.Fatal(err)
		}
	}
	f.undo = map[string][]undo{}
	return dropped
}

type faultNode struct {
	fs.LoopbackNode
	ffs *faultFS
}

func (n *faultNode) rel() string { return n.Path(n.Root()) }

func (n *faultNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fh, fl, errno := n.LoopbackNode.Open(ctx, flags)
	if errno != 0 {
		return nil, 0, errno
	}
	return &faultFile{LoopbackFile: fh.(*fs.LoopbackFile), ffs: n.ffs, rel: n.rel()}, fl, 0
}

func (n *faultNode) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	ch, fh, fl, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	return ch, &faultFile{LoopbackFile: fh.(*fs.LoopbackFile), ffs: n.ffs, rel: filepath.Join(n.rel(), name)}, fl, 0
}

// faultFile is a loopback file whose writes, truncates and fsyncs go through
// the faultFS.
type faultFile struct {
	*fs.LoopbackFile
	ffs *faultFS
	rel string
}

// PassthroughFd refuses FUSE passthrough: every write must reach Write.
func (f *faultFile) PassthroughFd() (int, bool) { return 0, false }

// state reads the file's size and the bytes at [off, off+n) as they are now.
func (f *faultFile) state(off int64, n int) undo {
	path := filepath.Join(f.ffs.under, f.rel)
	u := undo{off: off}
	if fi, err := os.Stat(path); err == nil {
		u.size = fi.Size()
	}
	if off < u.size {
		u.old = make([]byte, min(int64(n), u.size-off))
		if file, err := os.Open(path); err == nil {
			_, _ = file.ReadAt(u.old, off)
			_ = file.Close()
		}
	}
	return u
}

func (f *faultFile) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	f.ffs.mu.Lock()
	defer f.ffs.mu.Unlock()
	if f.ffs.failWrites {
		f.ffs.failedCalls++
		return 0, syscall.EIO
	}
	f.ffs.writes++
	f.ffs.undo[f.rel] = append(f.ffs.undo[f.rel], f.state(off, len(data)))
	return f.LoopbackFile.Write(ctx, data, off)
}

func (f *faultFile) Setattr(ctx context.Context, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	f.ffs.mu.Lock()
	defer f.ffs.mu.Unlock()
	if sz, ok := in.GetSize(); ok {
		u := f.state(int64(sz), 1<<62)
		f.ffs.undo[f.rel] = append(f.ffs.undo[f.rel], u)
	}
	return f.LoopbackFile.Setattr(ctx, in, out)
}

func (f *faultFile) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	f.ffs.mu.Lock()
	defer f.ffs.mu.Unlock()
	if f.ffs.failFsyncs {
		// As Linux does after a failed writeback, the dirty pages count as
		// written: the file now holds them, but they may be gone after a
		// power cut. Keep them in the undo log.
		f.ffs.failedCalls++
		return syscall.EIO
	}
	f.ffs.fsyncs++
	time.Sleep(f.ffs.syncDelay)
	if errno := f.LoopbackFile.Fsync(ctx, flags); errno != 0 {
		return errno
	}
	delete(f.ffs.undo, f.rel)
	return 0
}
