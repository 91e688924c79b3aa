package robustness

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
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
// (beyond the old end of the file: nothing) and the file's size before it;
// and what it did, so that a harsh power cut can replay it: the bytes a
// write wrote (data), or the size a truncate set (trunc, truncTo).
type undo struct {
	off  int64
	old  []byte
	size int64

	data    []byte
	trunc   bool
	truncTo int64
}

// sector is the unit a disk writes atomically: a harsh power cut tears a
// write at these boundaries of the file's offsets, never inside one.
const sector = 512

// cut is what a power cut does to the writes not synced yet, per file.
type cut int

const (
	// cutAll drops every unsynced write.
	cutAll cut = iota
	// cutSuffix drops the unsynced writes after a random point: the disk
	// wrote the earlier ones back, in order.
	cutSuffix
	// cutHarsh keeps an arbitrary subset of the unsynced writes, in any
	// order: each write is dropped, kept, or torn (each of its 512-byte
	// sectors kept or dropped on its own), a third of the time each. No
	// design passes it by relying on ordered write-back.
	cutHarsh
)

func (c cut) String() string { return [...]string{"all", "suffix", "harsh"}[c] }

// cutMode is one way of cutting the power that every power-cut test runs:
// round i cuts with cuts[i%len(cuts)].
type cutMode struct {
	name string
	cuts []cut
}

// cutModes are the modes of every power-cut test: "ordered" (every unsynced
// write dropped in even rounds, a suffix of them in odd ones) and "harsh".
var cutModes = []cutMode{{"ordered", []cut{cutAll, cutSuffix}}, {"harsh", []cut{cutHarsh}}}

// cutStats is what a power cut did: unsynced writes (and truncates) seen,
// dropped whole, and torn (some of their sectors kept, others not).
type cutStats struct{ writes, dropped, torn int }

func (s *cutStats) add(o cutStats) {
	s.writes += o.writes
	s.dropped += o.dropped
	s.torn += o.torn
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
// applies c to the unsynced writes of every file (see cut), choosing with r.
func (f *faultFS) powerCut(t *testing.T, r *rand.Rand, c cut) cutStats {
	t.Helper()
	f.unmount(t)
	f.mu.Lock()
	defer f.mu.Unlock()
	var st cutStats
	for rel, us := range f.undo {
		file, err := os.OpenFile(filepath.Join(f.under, rel), os.O_RDWR, 0)
		if err != nil {
			t.Fatalf("power cut: %v", err)
		}
		from := 0 // undo us[from:], newest first: the file as it was then
		if c == cutSuffix && len(us) > 0 {
			from = r.IntN(len(us) + 1)
		}
		for i := len(us) - 1; i >= from; i-- {
			u := us[i]
			if _, err := file.WriteAt(u.old, u.off); err != nil {
				t.Fatalf("power cut: %v", err)
			}
			if err := file.Truncate(u.size); err != nil {
				t.Fatalf("power cut: %v", err)
			}
		}
		st.writes += len(us)
		st.dropped += len(us) - from
		if c == cutHarsh {
			// The file is back as of its last fsync: redo a subset.
			for _, u := range us {
				keep := redo(r, u)
				if err := apply(file, u, keep); err != nil {
					t.Fatalf("power cut: %v", err)
				}
				switch {
				case len(keep) == 0:
				case keep[0].off == u.off && keep[0].n == len(u.data) || u.trunc:
					st.dropped--
				default:
					st.dropped--
					st.torn++
				}
			}
		}
		if err := file.Close(); err != nil {
			t.Fatal(err)
		}
	}
	f.undo = map[string][]undo{}
	return st
}

// piece is a run of bytes of a write, at off in the file.
type piece struct {
	off int64
	n   int
}

// redo chooses what a harsh cut keeps of u: nothing, all of it, or (torn) a
// random subset of its 512-byte sectors, as runs of contiguous sectors.
func redo(r *rand.Rand, u undo) []piece {
	fate := r.IntN(3)
	if u.trunc {
		if fate == 0 {
			return nil
		}
		return []piece{{}}
	}
	switch fate {
	case 0:
		return nil
	case 1:
		return []piece{{u.off, len(u.data)}}
	}
	var ps []piece
	for off, end := u.off, u.off+int64(len(u.data)); off < end; {
		next := min((off/sector+1)*sector, end)
		if r.IntN(2) == 0 {
			if l := len(ps) - 1; l >= 0 && ps[l].off+int64(ps[l].n) == off {
				ps[l].n += int(next - off)
			} else {
				ps = append(ps, piece{off, int(next - off)})
			}
		}
		off = next
	}
	return ps
}

// apply redoes the pieces keep of u on file.
func apply(file *os.File, u undo, keep []piece) error {
	if u.trunc {
		if len(keep) > 0 {
			return file.Truncate(u.truncTo)
		}
		return nil
	}
	for _, p := range keep {
		if _, err := file.WriteAt(u.data[p.off-u.off:][:p.n], p.off); err != nil {
			return err
		}
	}
	return nil
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
	u := f.state(off, len(data))
	u.data = slices.Clone(data)
	f.ffs.undo[f.rel] = append(f.ffs.undo[f.rel], u)
	return f.LoopbackFile.Write(ctx, data, off)
}

func (f *faultFile) Setattr(ctx context.Context, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	f.ffs.mu.Lock()
	defer f.ffs.mu.Unlock()
	if sz, ok := in.GetSize(); ok {
		u := f.state(int64(sz), 1<<62)
		u.trunc, u.truncTo = true, int64(sz)
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
