package idem

import (
	"cmp"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
)

// The journal's segment files: <path>.journal/<id>, beside the bbolt file at
// path and covered by its lock (the engine opens them only after bbolt's
// flock on path is held, exclusive for a writer, shared for a read-only open).
//
// A segment is preallocated: made at its full size, of zeros, written and
// fsync'ed once, and the directory fsync'ed, before its first frame. A frame
// then overwrites sectors the file already has, so the fdatasync that makes
// it durable flushes those sectors and no metadata (a file growing under
// appends would sync its size, and its allocation, on every append). A
// segment whose frames the checkpoint covers is recycled: written again from
// its start, its old frames left behind the new ones. Their sequence numbers
// tell them apart (replay.go): an old frame's is at or below the checkpoint.

// DefaultJournalSize is the journal's bound when BoltOptions.JournalSize is
// zero: 256 MiB of segment files.
const DefaultJournalSize = 256 << 20

// segmentSize is a segment's size: small enough to preallocate at once, when
// the journal needs another (on a small disk too), large enough that a frame
// seldom falls back to a direct commit (journal.go) and that the checkpoint
// frees one long before the next fills.
const segmentSize = 1 << 20

// zeroChunk is the zeros a segment is written with, a chunk at a time.
var zeroChunk = make([]byte, 64<<10)

// segment is one segment file.
type segment struct {
	id   uint64
	path string
	f    *os.File
	size int64
	pos  int64  // where the next frame goes
	last uint64 // the highest sequence number written since its (re)use; 0 for none
}

// journalDir is the directory of the journal of the bbolt file at path:
// beside the file itself, its path's symbolic links resolved, so that every
// path to one file (a link, a bind mount's target) finds one journal.
func journalDir(path string) string {
	if real, err := filepath.EvalSymlinks(path); err == nil {
		path = real
	}
	return path + ".journal"
}

func segmentName(id uint64) string { return fmt.Sprintf("%08d", id) }

// createSegment makes segment id in dir: size bytes of zeros, synced, then
// the directory synced. A creation cut short leaves zeros (no frame) in a
// file that may be short, which the next open removes (newSegments).
func createSegment(dir string, id uint64, size int64) (_ *segment, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	name := filepath.Join(dir, segmentName(id))
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(name)
		}
	}()
	for off := int64(0); off < size; {
		n := min(int64(len(zeroChunk)), size-off)
		if _, err := f.WriteAt(zeroChunk[:n], off); err != nil {
			return nil, err
		}
		off += n
	}
	if err := f.Sync(); err != nil {
		return nil, err
	}
	if err := syncDir(dir); err != nil {
		return nil, err
	}
	return &segment{id: id, path: name, f: f, size: size}, nil
}

// makeJournalDir makes the journal's directory dir if it is missing, and
// syncs its parent so the name is durable; an existing dir must be a
// directory this process can write in.
func makeJournalDir(dir string) error {
	fi, err := os.Lstat(dir)
	switch {
	case err == nil && fi.IsDir():
	case err == nil:
		return fmt.Errorf("%s is not a directory (mode %s); move it away", dir, fi.Mode().Type())
	case !os.IsNotExist(err):
		return err
	default:
		if err := os.Mkdir(dir, 0o700); err != nil {
			return err
		}
		if err := syncDir(filepath.Dir(dir)); err != nil {
			return err
		}
	}
	return nil
}

// syncDir fsyncs directory dir, so the names made in it are durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// openSegments opens the segments in dir, by id: none if dir does not exist.
func openSegments(dir string, readOnly bool) ([]*segment, error) {
	ents, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var segs []*segment
	for _, e := range ents {
		name := e.Name()
		id, err := strconv.ParseUint(name, 10, 64)
		if err != nil || !e.Type().IsRegular() {
			continue // not ours
		}
		flag := os.O_RDWR
		if readOnly {
			flag = os.O_RDONLY
		}
		p := filepath.Join(dir, name)
		f, err := os.OpenFile(p, flag, 0)
		if err != nil {
			closeSegments(segs)
			return nil, err
		}
		fi, err := f.Stat()
		if err != nil {
			_ = f.Close()
			closeSegments(segs)
			return nil, err
		}
		segs = append(segs, &segment{id: id, path: p, f: f, size: fi.Size()})
	}
	slices.SortFunc(segs, func(a, b *segment) int { return cmp.Compare(a.id, b.id) })
	return segs, nil
}

func closeSegments(segs []*segment) {
	for _, s := range segs {
		_ = s.f.Close()
	}
}

// read returns the segment's bytes.
func (s *segment) read() ([]byte, error) {
	b := make([]byte, s.size)
	n, err := s.f.ReadAt(b, 0)
	if err == io.EOF {
		err = nil
	}
	return b[:n], err
}

// segments is the journal's set of segment files: the active one, which
// takes frames, the free ones (recycled, or never used), and the rest,
// which hold frames the checkpoint does not cover yet.
type segments struct {
	dir   string
	size  int64 // of a new segment
	limit int64 // the most bytes of segments (BoltOptions.JournalSize)

	mu     sync.Mutex
	cond   *sync.Cond // signalled when a segment is freed, or the journal stops
	all    []*segment
	active *segment
	free   []*segment
	nextID uint64
	freed  uint64 // counts releases that freed room
	closed bool
}

// newSegments takes over the existing segments: free, but for those that
// hold frames the checkpoint does not cover yet (held: their last frame).
func newSegments(dir string, size, limit int64, existing []*segment, held map[*segment]uint64) *segments {
	ss := &segments{dir: dir, size: size, limit: limit, nextID: 1}
	ss.cond = sync.NewCond(&ss.mu)
	for _, s := range existing {
		ss.nextID = max(ss.nextID, s.id+1)
		if last, ok := held[s]; ok {
			s.pos, s.last = s.size, last // full: never written until released
			ss.all = append(ss.all, s)
			continue
		}
		if s.size != size {
			// Another build's size, or cut short: not reused.
			_ = s.f.Close()
			_ = os.Remove(s.path)
			continue
		}
		ss.all = append(ss.all, s)
		ss.free = append(ss.free, s)
	}
	return ss
}

// reserve finds room for a frame of n bytes numbered seq and returns the
// segment and offset to write it at. It returns a nil segment when the
// journal is full (every segment holds frames the checkpoint does not cover,
// and the limit allows no more), and the count of releases to give wait,
// which returns once the checkpoint frees room: the caller then tries again. A new segment is made here, on the writer's path,
// once per segmentSize bytes until the journal reaches its working size.
func (ss *segments) reserve(n int, seq uint64) (s *segment, off int64, freed uint64, err error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.closed {
		return nil, 0, 0, errPipelineStopped
	}
	if a := ss.active; a != nil && a.pos+int64(n) <= a.size {
		return a, ss.take(a, n, seq), 0, nil
	}
	if len(ss.free) > 0 {
		a := ss.free[0]
		ss.free = ss.free[1:]
		ss.active = a
		return a, ss.take(a, n, seq), 0, nil
	}
	if int64(len(ss.all)+1)*ss.size > ss.limit && len(ss.all) > 0 {
		return nil, 0, ss.freed, nil
	}
	a, err := createSegment(ss.dir, ss.nextID, ss.size)
	if err != nil {
		return nil, 0, 0, err
	}
	ss.nextID++
	ss.all = append(ss.all, a)
	ss.active = a
	return a, ss.take(a, n, seq), 0, nil
}

// take reserves n bytes of a for frame seq and returns their offset.
func (ss *segments) take(a *segment, n int, seq uint64) int64 {
	off := a.pos
	a.pos += int64(n)
	a.last = seq
	return off
}

// wait blocks until a release after reserve's count freed, or the journal
// closes.
func (ss *segments) wait(freed uint64) {
	ss.mu.Lock()
	for ss.freed == freed && !ss.closed {
		ss.cond.Wait()
	}
	ss.mu.Unlock()
}

// release frees the segments whose frames are all at or below ckpt: the
// others to the free list, the active one to be written again from its
// start.
func (ss *segments) release(ckpt uint64) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	freed := false
	for _, s := range ss.all {
		if s.last == 0 || s.last > ckpt {
			continue
		}
		s.pos, s.last = 0, 0
		if s != ss.active {
			ss.free = append(ss.free, s)
		}
		freed = true
	}
	if freed {
		ss.freed++
		ss.cond.Broadcast()
	}
}

// wake wakes the writers waiting for room, to look again (at a failure).
func (ss *segments) wake() {
	ss.mu.Lock()
	ss.freed++
	ss.cond.Broadcast()
	ss.mu.Unlock()
}

// bytes is the size of the segment files.
func (ss *segments) bytes() int64 {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return int64(len(ss.all)) * ss.size
}

// close closes the files and wakes a waiting writer; with remove, after a
// checkpoint that covers every frame, it removes the journal's directory,
// so a file closed cleanly needs no journal (its loss in a power cut only
// leaves frames the checkpoint covers).
func (ss *segments) close(remove bool) error {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.closed = true
	closeSegments(ss.all)
	ss.cond.Broadcast()
	if remove {
		return os.RemoveAll(ss.dir)
	}
	return nil
}
