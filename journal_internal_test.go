package idem

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"
	bbolterrors "go.etcd.io/bbolt/errors"
)

func TestFrameRoundTrip(t *testing.T) {
	ms := []mutation{
		{bucket: []byte("slot:a"), key: []byte("k1"), value: []byte("v1")},
		{bucket: []byte("slot:a"), key: []byte("k2"), del: true},
		{bucket: []byte("slot:b"), key: []byte("k3"), value: []byte{}},
	}
	payload := appendBatch(nil, ms)
	frame := appendFrame(nil, 7, 42, payload)
	require.Equal(t, frameSize(len(payload)), len(frame))
	require.Zero(t, len(frame)%frameAlign)

	seq, got, size, ok := parseFrame(append(frame, make([]byte, 64)...), 7)
	require.True(t, ok)
	require.Equal(t, uint64(42), seq)
	require.Equal(t, len(frame), size)
	back, err := decodeBatch(got)
	require.NoError(t, err)
	require.Len(t, back, 3)
	require.Equal(t, "v1", string(back[0].value))
	require.True(t, back[1].del)
	require.NotNil(t, back[2].value, "an empty value stays a put")

	t.Run("another journal's salt fails the checksum", func(t *testing.T) {
		_, _, _, ok := parseFrame(frame, 8)
		require.False(t, ok)
	})
	t.Run("zeros are no frame", func(t *testing.T) {
		_, _, _, ok := parseFrame(make([]byte, 256), 0)
		require.False(t, ok)
	})
	t.Run("every torn prefix and every flipped byte is no frame", func(t *testing.T) {
		for n := range len(frame) - (size - frameHeader - len(got)) {
			torn := append(bytes.Clone(frame[:n]), bytes.Repeat([]byte{0xaa}, len(frame)-n)...)
			_, _, _, ok := parseFrame(torn, 7)
			require.False(t, ok, "cut at %d", n)
		}
		for i := range frameHeader + len(got) {
			bad := bytes.Clone(frame)
			bad[i] ^= 0x40
			_, _, _, ok := parseFrame(bad, 7)
			require.False(t, ok, "byte %d flipped", i)
		}
	})
	t.Run("a malformed batch is refused", func(t *testing.T) {
		for _, p := range [][]byte{nil, {5}, {1, 9}, append(bytes.Clone(payload), 0)} {
			_, err := decodeBatch(p)
			require.ErrorIs(t, err, errBatch, "%x", p)
		}
	})
}

func FuzzDecodeBatch(f *testing.F) {
	f.Add(appendBatch(nil, []mutation{{bucket: []byte("b"), key: []byte("k"), value: []byte("v")}, {bucket: []byte("b"), key: []byte("x"), del: true}}))
	f.Add([]byte{0})
	f.Add([]byte{1, 1, 1, 'b', 1, 'k', 0})
	f.Fuzz(func(t *testing.T, p []byte) {
		ms, err := decodeBatch(p)
		if err != nil {
			return
		}
		require.Equal(t, p, appendBatch(nil, ms), "a batch that decodes encodes back to its bytes")
	})
}

func FuzzParseFrame(f *testing.F) {
	f.Add(appendFrame(nil, 3, 1, appendBatch(nil, []mutation{{bucket: []byte("b"), key: []byte("k"), value: []byte("v")}})))
	f.Add(make([]byte, 32))
	f.Fuzz(func(t *testing.T, b []byte) {
		seq, payload, size, ok := parseFrame(b, 3)
		if !ok {
			return
		}
		require.LessOrEqual(t, size, len(b))
		require.Equal(t, b[:size], appendFrame(nil, 3, seq, payload), "a frame that parses is the frame of its payload")
	})
}

// writeSegment makes a segment of size bytes in dir holding the frames of
// seqs at its start, one put each, then garbage if torn is set.
func writeSegment(t *testing.T, dir string, id uint64, salt uint32, seqs []uint64, tail []byte) *segment {
	t.Helper()
	s, err := createSegment(dir, id, 4096)
	require.NoError(t, err)
	var b []byte
	for _, seq := range seqs {
		b = appendFrame(b, salt, seq, appendBatch(nil, []mutation{{bucket: []byte("b"), key: []byte{byte(seq)}, value: []byte("v")}}))
	}
	b = append(b, tail...)
	_, err = s.f.WriteAt(b, 0)
	require.NoError(t, err)
	return s
}

func TestScanJournal(t *testing.T) {
	const salt = 99
	scan := func(t *testing.T, ckpt uint64, segs ...*segment) (*journalScan, error) {
		t.Helper()
		t.Cleanup(func() { closeSegments(segs) })
		return scanJournal(segs, salt, ckpt)
	}
	seqs := func(sc *journalScan) (out []uint64) {
		for _, f := range sc.frames {
			out = append(out, f.seq)
		}
		return out
	}
	t.Run("frames after the checkpoint, across segments, in order", func(t *testing.T) {
		dir := t.TempDir()
		sc, err := scan(t, 2, writeSegment(t, dir, 1, salt, []uint64{5, 6}, nil), writeSegment(t, dir, 2, salt, []uint64{1, 2, 3, 4}, nil))
		require.NoError(t, err)
		require.Equal(t, []uint64{3, 4, 5, 6}, seqs(sc))
		require.Equal(t, uint64(6), sc.last(2))
	})
	t.Run("a torn tail ends replay", func(t *testing.T) {
		dir := t.TempDir()
		torn := appendFrame(nil, salt, 4, []byte("abcdefgh"))
		torn[20] ^= 1
		sc, err := scan(t, 0, writeSegment(t, dir, 1, salt, []uint64{1, 2, 3}, torn))
		require.NoError(t, err)
		require.Equal(t, []uint64{1, 2, 3}, seqs(sc))
	})
	t.Run("a recycled segment's old frames are told apart by their numbers", func(t *testing.T) {
		dir := t.TempDir()
		// 7 and 8 overwrote the start of a segment that held 1 to 4: 3 and 4
		// are still behind them.
		s := writeSegment(t, dir, 1, salt, []uint64{1, 2, 3, 4}, nil)
		fr := appendFrame(nil, salt, 7, appendBatch(nil, []mutation{{bucket: []byte("b"), key: []byte{7}, value: []byte("v")}}))
		fr = appendFrame(fr, salt, 8, appendBatch(nil, []mutation{{bucket: []byte("b"), key: []byte{8}, value: []byte("v")}}))
		_, err := s.f.WriteAt(fr, 0)
		require.NoError(t, err)
		sc, err := scan(t, 6, s)
		require.NoError(t, err)
		require.Equal(t, []uint64{7, 8}, seqs(sc))
	})
	t.Run("a bad frame before a durable one is damage", func(t *testing.T) {
		dir := t.TempDir()
		s := writeSegment(t, dir, 1, salt, []uint64{1, 2, 3}, nil)
		// Damage frame 2 (its payload), with 3 valid after it.
		size := frameSize(len(appendBatch(nil, []mutation{{bucket: []byte("b"), key: []byte{1}, value: []byte("v")}})))
		_, err := s.f.WriteAt([]byte{0xff}, int64(size+frameHeader+2))
		require.NoError(t, err)
		_, err = scan(t, 0, s)
		require.ErrorIs(t, err, ErrCorrupt)
		require.ErrorContains(t, err, "frame 2 is missing or damaged, but frame 3")
	})
	t.Run("a missing frame before a durable one in another segment is damage", func(t *testing.T) {
		dir := t.TempDir()
		_, err := scan(t, 0, writeSegment(t, dir, 1, salt, []uint64{1, 2}, nil), writeSegment(t, dir, 2, salt, []uint64{4, 5}, nil))
		require.ErrorIs(t, err, ErrCorrupt)
	})
	t.Run("damage at or before the checkpoint is not looked for", func(t *testing.T) {
		dir := t.TempDir()
		sc, err := scan(t, 5, writeSegment(t, dir, 1, salt, []uint64{1, 2}, nil), writeSegment(t, dir, 2, salt, []uint64{4, 5}, nil))
		require.NoError(t, err)
		require.Empty(t, sc.frames)
	})
}

func TestSegmentsRecycle(t *testing.T) {
	dir := t.TempDir()
	ss := newSegments(dir, 4096, 2*4096, nil, nil)
	defer func() { _ = ss.close(false) }()
	frame := 1024
	var used []*segment
	for seq := uint64(1); seq <= 8; seq++ {
		s, off, _, err := ss.reserve(frame, seq)
		require.NoError(t, err)
		require.NotNil(t, s, "frame %d", seq)
		require.Equal(t, int64((seq-1)%4)*int64(frame), off)
		used = append(used, s)
	}
	require.NotSame(t, used[0], used[4], "the second segment after the first filled")
	s, _, freed, err := ss.reserve(frame, 9)
	require.NoError(t, err)
	require.Nil(t, s, "the journal is full: the writer waits for the checkpoint")
	done := make(chan struct{})
	go func() { ss.wait(freed); close(done) }()
	ss.release(4) // the first segment's frames are in bbolt
	<-done
	s, off, _, err := ss.reserve(frame, 9)
	require.NoError(t, err)
	require.Same(t, used[0], s, "the first segment is recycled")
	require.Zero(t, off)
	require.Equal(t, int64(2*4096), ss.bytes())
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, ents, 2)
}

// openNoCheckpoint opens a journaled engine at path whose checkpoint waits an
// hour, so that its writes stay in the journal and the overlay.
func openNoCheckpoint(t *testing.T, path string, f *BoltOptions) *Engine {
	t.Helper()
	e, err := OpenFile(path, f, &Options{PruneInterval: -1})
	require.NoError(t, err)
	if e.b.j != nil {
		e.b.j.delay.Store(int64(time.Hour))
	}
	return e
}

// crashCopy copies the bbolt file and its journal, as a crash of the process
// would leave them: bbolt as of its last checkpoint, the journal's frames.
func crashCopy(t *testing.T, path string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "copy.db")
	copyFile(t, path, dst)
	ents, err := os.ReadDir(journalDir(path))
	require.NoError(t, err)
	require.NoError(t, os.Mkdir(journalDir(dst), 0o700))
	for _, e := range ents {
		copyFile(t, filepath.Join(journalDir(path), e.Name()), filepath.Join(journalDir(dst), e.Name()))
	}
	return dst
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(dst, b, 0o600))
}

func TestJournalReadersSeeAcknowledgedWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "j.db")
	e := openNoCheckpoint(t, path, nil)
	ctx := context.Background()
	for _, k := range []string{"a", "b", "c"} {
		_, err := e.Do(ctx, k, []byte("fp"), func(context.Context) ([]byte, error) { return []byte("r-" + k), nil })
		require.NoError(t, err)
	}
	require.False(t, e.b.ov.empty(), "the writes are in the overlay, not yet in bbolt")
	require.Zero(t, e.b.j.checkpoints.Load())

	r, err := e.Get("b")
	require.NoError(t, err)
	require.Equal(t, "r-b", string(r.Response))
	res, err := e.Do(ctx, "a", []byte("fp"), func(context.Context) ([]byte, error) { panic("replayed, never run") })
	require.NoError(t, err)
	require.True(t, res.Replayed)
	var keys []string
	require.NoError(t, e.Records(func(r *Record, err error) error {
		keys = append(keys, r.Key)
		return err
	}))
	require.ElementsMatch(t, []string{"a", "b", "c"}, keys)
	st, err := e.ScanFile()
	require.NoError(t, err)
	require.Equal(t, 3, st.Done)

	// A direct write (Forget) drains the overlay into bbolt first.
	require.NoError(t, e.Forget("c"))
	require.True(t, e.b.ov.empty())
	_, err = e.Get("c")
	require.ErrorIs(t, err, ErrNotFound)

	// Back into the journal; the crash copy replays it.
	_, err = e.Do(ctx, "d", []byte("fp"), func(context.Context) ([]byte, error) { return []byte("r-d"), nil })
	require.NoError(t, err)
	cp := crashCopy(t, path)
	require.NoError(t, e.Close())

	t.Run("read-only open reads the journal without writing", func(t *testing.T) {
		ro, err := OpenFile(cp, &BoltOptions{ReadOnly: true}, &Options{PruneInterval: -1})
		require.NoError(t, err)
		defer ro.Close()
		r, err := ro.Get("d")
		require.NoError(t, err)
		require.Equal(t, "r-d", string(r.Response))
		require.Equal(t, uint64(2), ro.Stats().Replayed, "d's started and done records")
	})
	t.Run("open replays it into bbolt, once", func(t *testing.T) {
		e, err := OpenFile(cp, nil, &Options{PruneInterval: -1})
		require.NoError(t, err)
		require.Equal(t, uint64(2), e.Stats().Replayed)
		require.True(t, e.b.ov.empty(), "replayed into bbolt")
		for k, want := range map[string]string{"a": "r-a", "b": "r-b", "d": "r-d"} {
			r, err := e.Get(k)
			require.NoError(t, err, k)
			require.Equal(t, want, string(r.Response))
		}
		_, err = e.Get("c")
		require.ErrorIs(t, err, ErrNotFound)
		require.NoError(t, e.Close())

		e, err = OpenFile(cp, nil, &Options{PruneInterval: -1})
		require.NoError(t, err)
		require.Zero(t, e.Stats().Replayed, "the checkpoint covers what the first open replayed")
		require.NoError(t, e.Close())
	})
}

func TestJournalCloseCheckpoints(t *testing.T) {
	path := filepath.Join(t.TempDir(), "j.db")
	e := openNoCheckpoint(t, path, nil)
	_, err := e.Do(context.Background(), "k", nil, func(context.Context) ([]byte, error) { return []byte("r"), nil })
	require.NoError(t, err)
	require.NoError(t, e.Close())
	// bbolt alone holds the record: a file without its journal still has it.
	require.NoError(t, os.RemoveAll(journalDir(path)))
	e, err = Open(path, &Options{PruneInterval: -1})
	require.NoError(t, err)
	defer e.Close()
	r, err := e.Get("k")
	require.NoError(t, err)
	require.Equal(t, "r", string(r.Response))
}

func TestJournalBackupNeedsNoJournal(t *testing.T) {
	path := filepath.Join(t.TempDir(), "j.db")
	e := openNoCheckpoint(t, path, nil)
	defer e.Close()
	_, err := e.Do(context.Background(), "k", nil, func(context.Context) ([]byte, error) { return []byte("r"), nil })
	require.NoError(t, err)
	dst := filepath.Join(t.TempDir(), "backup.db")
	require.NoError(t, e.BackupFile(dst))
	b, err := OpenFile(dst, &BoltOptions{ReadOnly: true}, nil)
	require.NoError(t, err)
	defer b.Close()
	r, err := b.Get("k")
	require.NoError(t, err)
	require.Equal(t, "r", string(r.Response))
	_, err = os.Stat(journalDir(dst))
	require.True(t, os.IsNotExist(err), "the backup has no journal")
}

func TestJournalOffWritesBbolt(t *testing.T) {
	for name, f := range map[string]*BoltOptions{
		"negative JournalSize": {JournalSize: -1},
		"MaxSize":              {MaxSize: 1 << 30},
		"NoSync":               {NoSync: true},
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "j.db")
			e, err := OpenFile(path, f, &Options{PruneInterval: -1})
			require.NoError(t, err)
			defer e.Close()
			require.Nil(t, e.b.j)
			_, err = e.Do(context.Background(), "k", nil, func(context.Context) ([]byte, error) { return []byte("r"), nil })
			require.NoError(t, err)
			require.NoError(t, e.b.db.View(func(tx *bbolt.Tx) error {
				v, _, ok := e.b.st.find(boltRec{tx}, []byte("k"), time.Time{})
				require.True(t, ok)
				require.NotNil(t, v)
				return nil
			}))
		})
	}
}

// A journal whose writes made a time slot bbolt does not have yet: a
// read-only open finds them there (the overlay's slots are known).
func TestJournalReadOnlyOpenKnowsTheOverlaysSlots(t *testing.T) {
	path := filepath.Join(t.TempDir(), "j.db")
	e := openNoCheckpoint(t, path, nil)
	_, err := e.Do(context.Background(), "k", nil, func(context.Context) ([]byte, error) { return []byte("r"), nil })
	require.NoError(t, err)
	cp := crashCopy(t, path)
	require.NoError(t, e.Close())
	ro, err := OpenFile(cp, &BoltOptions{ReadOnly: true}, &Options{PruneInterval: -1})
	require.NoError(t, err)
	defer ro.Close()
	r, err := ro.Get("k")
	require.NoError(t, err)
	require.Equal(t, "r", string(r.Response))
	_, err = ro.Backup(io.Discard)
	require.ErrorIs(t, err, bbolterrors.ErrDatabaseReadOnly, "a copy of the file alone would lose the journal's writes")
}

// One caller's failing function is dropped alone: its writes never reach
// the journal, and the callers grouped with it are not run again.
func TestJournalDropsAFailingCallerAlone(t *testing.T) {
	path := filepath.Join(t.TempDir(), "j.db")
	e := openNoCheckpoint(t, path, nil)
	defer e.Close()
	bucket := timeSlot{Start: 0, End: 1}.Name()
	var wg sync.WaitGroup
	runs := make([]atomic.Int32, 40)
	errs := make([]error, 40)
	for i := range 40 {
		wg.Go(func() {
			errs[i] = e.b.j.do(func(w *jtx) error {
				runs[i].Add(1)
				if err := w.put(bucket, []byte{byte(i)}, []byte("v")); err != nil {
					return err
				}
				if i%2 == 1 {
					return errors.New("fn failed")
				}
				return nil
			})
		})
	}
	wg.Wait()
	e.b.ov.mu.RLock()
	defer e.b.ov.mu.RUnlock()
	for i := range 40 {
		require.EqualValues(t, 1, runs[i].Load(), "caller %d ran once", i)
		got := e.b.ov.get(bucket, []byte{byte(i)})
		if i%2 == 1 {
			require.EqualError(t, errs[i], "fn failed")
			require.Nil(t, got, "caller %d's writes dropped", i)
		} else {
			require.NoError(t, errs[i])
			require.NotNil(t, got, "caller %d's writes kept", i)
		}
	}
}

// A journal at its bound makes its writers wait for a checkpoint, which
// then runs at once (not catchUpDelay later) and frees its segments.
func TestJournalBackPressure(t *testing.T) {
	path := filepath.Join(t.TempDir(), "j.db")
	e := openNoCheckpoint(t, path, &BoltOptions{JournalSize: 2 * segmentSize})
	defer e.Close()
	resp := bytes.Repeat([]byte("x"), 16<<10)
	for i := range 200 { // 400 frames of 16 KiB: 6 MiB through a 2 MiB journal
		_, err := e.Do(context.Background(), "k"+strconv.Itoa(i), nil, func(context.Context) ([]byte, error) { return resp, nil })
		require.NoError(t, err)
	}
	require.Positive(t, e.b.j.checkpoints.Load(), "the writer waited for checkpoints")
	require.LessOrEqual(t, e.b.j.segs.bytes(), int64(2*segmentSize), "the journal stayed in its bound")
	r, err := e.Get("k0")
	require.NoError(t, err)
	require.Equal(t, resp, r.Response)
}
