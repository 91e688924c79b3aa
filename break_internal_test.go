package idem

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"
	bbolterrors "go.etcd.io/bbolt/errors"
)

// Tests written while trying to break the journal (branch break20).

// openNoCheckpointOpts is openNoCheckpoint with the engine's options o.
func openNoCheckpointOpts(t *testing.T, path string, f *BoltOptions, o *Options) *Engine {
	t.Helper()
	e, err := OpenFile(path, f, o)
	require.NoError(t, err)
	if e.b.j != nil {
		e.b.j.delay.Store(int64(time.Hour))
	}
	return e
}

var bigOpts = &Options{PruneInterval: -1, MaxResponseSize: 16 << 20}

// Concurrent duplicates, failures, panics, mismatches and huge responses in
// the same journal groups: each caller gets its own answer, nothing is run
// twice, and a crash copy replays every answer.
func TestBreakJournalMixedGroup(t *testing.T) {
	path := filepath.Join(t.TempDir(), "j.db")
	e := openNoCheckpointOpts(t, path, nil, bigOpts)
	ctx := context.Background()
	huge := bytes.Repeat([]byte("h"), 3<<20) // larger than a segment: a direct commit
	var runs sync.Map
	count := func(k string) int {
		v, _ := runs.LoadOrStore(k, new(atomic.Int32))
		return int(v.(*atomic.Int32).Add(1))
	}
	type answer struct {
		resp []byte
		err  error
	}
	answers := make([]answer, 64)
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Go(func() {
			defer func() {
				if v := recover(); v != nil {
					answers[i] = answer{err: fmt.Errorf("panicked: %v", v)}
				}
			}()
			k := "k" + strconv.Itoa(i%16) // four callers per key
			fp := []byte("fp")
			if i%16 == 3 && i >= 16 {
				fp = []byte("other") // a mismatch
			}
			res, err := e.Do(ctx, k, fp, func(context.Context) ([]byte, error) {
				count(k)
				switch i % 16 {
				case 5:
					return nil, errors.New("permanent")
				case 7:
					panic("boom")
				case 9:
					return huge, nil
				}
				return []byte("r-" + k), nil
			})
			answers[i] = answer{res.Response, err}
		})
	}
	wg.Wait()
	runs.Range(func(k, v any) bool {
		if k != "k7" {
			require.EqualValues(t, 1, v.(*atomic.Int32).Load(), "%s ran once", k)
		}
		return true
	})
	for i, a := range answers {
		switch i % 16 {
		case 3: // whichever fingerprint came first wins; the others mismatch
			if a.err != nil {
				require.ErrorIs(t, a.err, ErrFingerprintMismatch, i)
			} else {
				require.Equal(t, "r-k3", string(a.resp))
			}
		case 5:
			require.Error(t, a.err)
		case 7:
		case 9:
			require.NoError(t, a.err, i)
			require.Equal(t, len(huge), len(a.resp))
		default:
			require.NoError(t, a.err, i)
			require.Equal(t, "r-k"+strconv.Itoa(i%16), string(a.resp))
		}
	}
	cp := crashCopy(t, path)
	require.NoError(t, e.Close())
	e2, err := OpenFile(cp, nil, bigOpts)
	require.NoError(t, err)
	defer e2.Close()
	for i := range 16 {
		k := "k" + strconv.Itoa(i)
		res, err := e2.Do(ctx, k, []byte("fp"), func(ctx context.Context) ([]byte, error) {
			c, _ := CallFrom(ctx)
			if k != "k7" || !c.Recovered {
				t.Errorf("%s ran again after the crash (recovered %v)", k, c.Recovered)
			}
			return []byte("again"), nil
		})
		if i == 3 {
			continue // either fingerprint may have won
		}
		switch i {
		case 5:
			require.Error(t, err)
		case 7:
			require.NoError(t, err)
		case 9:
			require.NoError(t, err)
			require.Equal(t, huge, res.Response)
		default:
			require.NoError(t, err)
			require.Equal(t, "r-"+k, string(res.Response))
		}
	}
}

func TestBreakJournalKeys(t *testing.T) {
	path := filepath.Join(t.TempDir(), "j.db")
	e := openNoCheckpoint(t, path, nil)
	ctx := context.Background()
	k255 := strings.Repeat("é", 127) + "a" // 255 bytes
	require.Len(t, k255, 255)
	_, err := e.Do(ctx, k255, nil, func(context.Context) ([]byte, error) { return []byte("x"), nil })
	require.NoError(t, err)
	_, err = e.Do(ctx, k255+"b", nil, func(context.Context) ([]byte, error) { return []byte("x"), nil })
	require.ErrorIs(t, err, ErrInvalidKey)
	_, err = e.Do(ctx, "", nil, func(context.Context) ([]byte, error) { return []byte("x"), nil })
	require.ErrorIs(t, err, ErrInvalidKey)
	r, err := e.Get(k255)
	require.NoError(t, err)
	require.Equal(t, "x", string(r.Response))
	cp := crashCopy(t, path)
	require.NoError(t, e.Close())
	e2, err := OpenFile(cp, nil, &Options{PruneInterval: -1})
	require.NoError(t, err)
	defer e2.Close()
	res, err := e2.Do(ctx, k255, nil, func(context.Context) ([]byte, error) { return []byte("again"), nil })
	require.NoError(t, err)
	require.True(t, res.Replayed)
}

// The operator calls right after Do see the journal's writes.
func TestBreakJournalOperatorsAfterDo(t *testing.T) {
	path := filepath.Join(t.TempDir(), "j.db")
	e := openNoCheckpoint(t, path, &BoltOptions{JournalSize: 2 * segmentSize})
	defer e.Close()
	ctx := context.Background()
	for i := range 30 {
		k := "k" + strconv.Itoa(i)
		_, err := e.Do(ctx, k, nil, func(context.Context) ([]byte, error) { return []byte("r" + k), nil })
		require.NoError(t, err)
		switch i % 3 {
		case 0:
			require.NoError(t, e.Forget(k))
			_, err = e.Get(k)
			require.ErrorIs(t, err, ErrNotFound)
			res, err := e.Do(ctx, k, nil, func(context.Context) ([]byte, error) { return []byte("new"), nil })
			require.NoError(t, err)
			require.False(t, res.Replayed)
			require.Equal(t, "new", string(res.Response))
		case 1:
			n, err := e.Prune(ctx)
			require.NoError(t, err)
			require.Zero(t, n)
			r, err := e.Get(k)
			require.NoError(t, err)
			require.Equal(t, "r"+k, string(r.Response))
		case 2:
			seen := 0
			require.NoError(t, e.Records(func(r *Record, err error) error {
				if r != nil && r.Key == k {
					seen++
				}
				return err
			}))
			require.Equal(t, 1, seen)
		}
	}
	// Resolve of a panicked key right after it.
	func() {
		defer func() { _ = recover() }()
		_, _ = e.Do(ctx, "p", nil, func(context.Context) ([]byte, error) { panic("x") })
	}()
	r, err := e.Get("p")
	require.NoError(t, err)
	require.Equal(t, StateStarted, r.State)
	require.NoError(t, e.Resolve("p", []byte("fixed"), nil))
	res, err := e.Do(ctx, "p", nil, func(context.Context) ([]byte, error) { return []byte("ran"), nil })
	require.NoError(t, err)
	require.Equal(t, "fixed", string(res.Response))
	_ = os.Remove
}

// pendingJournal leaves n keys' records in the journal of a crash copy and
// returns its path and its segment holding them, with the frames' offsets.
func pendingJournal(t *testing.T, n int) (cp, seg string, offs []int) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "j.db")
	e := openNoCheckpoint(t, path, nil)
	for i := range n {
		k := "k" + strconv.Itoa(i)
		_, err := e.Do(context.Background(), k, nil, func(context.Context) ([]byte, error) { return []byte("r" + k), nil })
		require.NoError(t, err)
	}
	cp = crashCopy(t, path)
	require.NoError(t, e.Close())
	ents, err := os.ReadDir(journalDir(cp))
	require.NoError(t, err)
	require.Len(t, ents, 1)
	seg = filepath.Join(journalDir(cp), ents[0].Name())
	data, err := os.ReadFile(seg)
	require.NoError(t, err)
	for off := 0; ; {
		n := int(binary.LittleEndian.Uint32(data[off:]))
		if n == 0 {
			break
		}
		offs = append(offs, off)
		off += frameSize(n)
	}
	require.Len(t, offs, 2*n)
	return cp, seg, offs
}

func flip(t *testing.T, path string, at int) {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	data[at] ^= 0x40
	require.NoError(t, os.WriteFile(path, data, 0o600))
}

func TestBreakJournalDamage(t *testing.T) {
	ctx := context.Background()
	t.Run("a flipped byte before the last frame is ErrCorrupt", func(t *testing.T) {
		for _, where := range []struct {
			name  string
			frame int
			delta int
		}{{"length", 0, 0}, {"crc", 1, 5}, {"seq", 2, 9}, {"payload", 3, frameHeader + 2}} {
			t.Run(where.name, func(t *testing.T) {
				cp, seg, offs := pendingJournal(t, 3)
				flip(t, seg, offs[where.frame]+where.delta)
				for _, ro := range []bool{false, true} {
					_, err := OpenFile(cp, &BoltOptions{ReadOnly: ro}, &Options{PruneInterval: -1})
					require.ErrorIs(t, err, ErrCorrupt, "read-only %v", ro)
				}
			})
		}
	})
	t.Run("a torn last frame is the tail", func(t *testing.T) {
		for _, how := range []string{"flip", "truncate", "zero"} {
			t.Run(how, func(t *testing.T) {
				cp, seg, offs := pendingJournal(t, 3)
				last := offs[len(offs)-1]
				switch how {
				case "flip":
					flip(t, seg, last+frameHeader+1)
				case "truncate":
					require.NoError(t, os.Truncate(seg, int64(last+frameHeader+3)))
				case "zero":
					data, err := os.ReadFile(seg)
					require.NoError(t, err)
					clear(data[last:])
					require.NoError(t, os.WriteFile(seg, data, 0o600))
				}
				e, err := OpenFile(cp, nil, &Options{PruneInterval: -1})
				require.NoError(t, err)
				r, err := e.Get("k1")
				require.NoError(t, err)
				require.Equal(t, "rk1", string(r.Response))
				r, err = e.Get("k2")
				require.NoError(t, err, "k2's started record survives")
				require.Equal(t, StateStarted, r.State)
				res, err := e.Do(ctx, "k2", nil, func(ctx context.Context) ([]byte, error) {
					c, _ := CallFrom(ctx)
					require.True(t, c.Recovered)
					return []byte("again"), nil
				})
				require.NoError(t, err)
				require.Equal(t, "again", string(res.Response))
				require.NoError(t, e.Close())
				e, err = OpenFile(cp, nil, &Options{PruneInterval: -1})
				require.NoError(t, err)
				r, err = e.Get("k2")
				require.NoError(t, err)
				require.Equal(t, "again", string(r.Response))
				require.NoError(t, e.Close())
			})
		}
	})
}

// A backup restored over a file whose journal is left beside it (the
// remedy the ErrCorrupt message names: "restore from a backup").
func TestBreakRestoredBackupBesideItsFilesJournal(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "j.db")
	e := openNoCheckpoint(t, path, &BoltOptions{JournalSize: 2 * segmentSize})
	_, err := e.Do(ctx, "before", nil, func(context.Context) ([]byte, error) { return []byte("b"), nil })
	require.NoError(t, err)
	backup := filepath.Join(t.TempDir(), "backup.db")
	require.NoError(t, e.BackupFile(backup))
	// Enough traffic after the backup that the journal recycles its
	// segments (the frames right after the backup's checkpoint are gone).
	resp := bytes.Repeat([]byte("x"), 16<<10)
	for i := range 200 {
		_, err := e.Do(ctx, "after"+strconv.Itoa(i), nil, func(context.Context) ([]byte, error) { return resp, nil })
		require.NoError(t, err)
	}
	cp := crashCopy(t, path) // the process dies
	require.NoError(t, e.Close())

	copyFile(t, backup, cp) // restore the backup; the journal directory stays
	e2, err := OpenFile(cp, nil, &Options{PruneInterval: -1})
	require.NoError(t, err, "the restored backup needs no journal, so a stale one beside it must not stop it")
	defer e2.Close()
	r, err := e2.Get("before")
	require.NoError(t, err)
	require.Equal(t, "b", string(r.Response))
}

// The same, before the journal recycles: the restored backup silently takes
// in the Do records written after it (and none of the direct writes, such
// as a Forget, made between them).
func TestBreakRestoredBackupTakesInLaterFrames(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "j.db")
	e := openNoCheckpoint(t, path, nil)
	_, err := e.Do(ctx, "before", nil, func(context.Context) ([]byte, error) { return []byte("b"), nil })
	require.NoError(t, err)
	backup := filepath.Join(t.TempDir(), "backup.db")
	require.NoError(t, e.BackupFile(backup))
	_, err = e.Do(ctx, "after", nil, func(context.Context) ([]byte, error) { return []byte("a"), nil })
	require.NoError(t, err)
	require.NoError(t, e.Forget("after")) // a direct write: bbolt, not the journal
	cp := crashCopy(t, path)
	require.NoError(t, e.Close())
	ro, err := OpenFile(cp, &BoltOptions{ReadOnly: true}, nil) // the crash copy lacks "after"
	require.NoError(t, err)
	_, err = ro.Get("after")
	require.ErrorIs(t, err, ErrNotFound)
	require.NoError(t, ro.Close())

	copyFile(t, backup, cp) // restore the backup; the journal directory stays
	e2, err := OpenFile(cp, nil, &Options{PruneInterval: -1})
	require.NoError(t, err)
	defer e2.Close()
	_, err = e2.Get("after")
	require.ErrorIs(t, err, ErrNotFound, "neither the backup nor the file it replaced holds \"after\"")
}

// A small journal, many callers with large responses (some larger than a
// segment), and Close while they run: no deadlock, and every answer a
// caller got replays after a reopen.
func TestBreakJournalFullAndCloseInFlight(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "j.db")
	e, err := OpenFile(path, &BoltOptions{JournalSize: 1}, bigOpts)
	require.NoError(t, err)
	var (
		mu   sync.Mutex
		got  = map[string]string{}
		ran  = map[string]int{}
		wg   sync.WaitGroup
		half = make(chan struct{})
		once sync.Once
		n    atomic.Int32
	)
	for g := range 24 {
		wg.Go(func() {
			for i := 0; ; i++ {
				k := fmt.Sprintf("k%d-%d", g, i%40)
				size := 100 << 10
				if i%17 == 0 {
					size = 1200 << 10
				}
				res, err := e.Do(ctx, k, nil, func(context.Context) ([]byte, error) {
					mu.Lock()
					ran[k]++
					mu.Unlock()
					return bytes.Repeat([]byte{byte(i)}, size), nil
				})
				if errors.Is(err, ErrClosed) {
					return
				}
				if err != nil {
					t.Errorf("%s: %v", k, err)
					return
				}
				mu.Lock()
				sum := fmt.Sprintf("%d:%x", len(res.Response), res.Response[:1])
				if old, ok := got[k]; ok && old != sum {
					t.Errorf("%s: answered %s, then %s", k, old, sum)
				}
				got[k] = sum
				mu.Unlock()
				if n.Add(1) == 600 {
					once.Do(func() { close(half) })
				}
			}
		})
	}
	<-half
	require.NoError(t, e.Close())
	wg.Wait()
	for k, c := range ran {
		require.Equal(t, 1, c, "%s ran %d times", k, c)
	}
	e, err = OpenFile(path, nil, bigOpts)
	require.NoError(t, err)
	defer e.Close()
	for k, want := range got {
		res, err := e.Do(ctx, k, nil, func(context.Context) ([]byte, error) { return nil, errors.New("ran again") })
		require.NoError(t, err, k)
		require.Equal(t, want, fmt.Sprintf("%d:%x", len(res.Response), res.Response[:1]), k)
	}
}

// Prune right after Do, with the records in the journal: the expired ones go,
// the crash copy does not bring them back, the live ones stay.
func TestBreakJournalPruneAfterDo(t *testing.T) {
	ctx := context.Background()
	var now atomic.Int64
	now.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	o := &Options{PruneInterval: -1, Retention: time.Minute, Now: func() time.Time { return time.Unix(0, now.Load()) }}
	path := filepath.Join(t.TempDir(), "j.db")
	e := openNoCheckpointOpts(t, path, nil, o)
	for i := range 20 {
		_, err := e.Do(ctx, "old"+strconv.Itoa(i), nil, func(context.Context) ([]byte, error) { return []byte("o"), nil })
		require.NoError(t, err)
	}
	now.Add(int64(2 * time.Hour))
	for i := range 20 {
		_, err := e.Do(ctx, "new"+strconv.Itoa(i), nil, func(context.Context) ([]byte, error) { return []byte("n"), nil })
		require.NoError(t, err)
	}
	n, err := e.Prune(ctx)
	require.NoError(t, err)
	require.Equal(t, 20, n)
	for i := range 5 {
		_, err := e.Do(ctx, "later"+strconv.Itoa(i), nil, func(context.Context) ([]byte, error) { return []byte("l"), nil })
		require.NoError(t, err)
	}
	cp := crashCopy(t, path)
	require.NoError(t, e.Close())
	for _, ro := range []bool{true, false} {
		e, err := OpenFile(cp, &BoltOptions{ReadOnly: ro}, o)
		require.NoError(t, err)
		keys := map[string]bool{}
		require.NoError(t, e.Records(func(r *Record, err error) error {
			if r != nil {
				keys[r.Key] = true
			}
			return err
		}))
		require.Len(t, keys, 25, "read-only %v", ro)
		for k := range keys {
			require.False(t, strings.HasPrefix(k, "old"), k)
		}
		st, err := e.ScanFile()
		require.NoError(t, err)
		require.Equal(t, 25, st.Done, "read-only %v", ro)
		require.NoError(t, e.Close())
	}
}

// A read-only open over a journal holding writes: replays come from it, and
// every write is refused with ErrDatabaseReadOnly, nothing run.
func TestBreakJournalReadOnlyDo(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "j.db")
	e := openNoCheckpoint(t, path, nil)
	_, err := e.Do(ctx, "done", nil, func(context.Context) ([]byte, error) { return []byte("d"), nil })
	require.NoError(t, err)
	func() {
		defer func() { _ = recover() }()
		_, _ = e.Do(ctx, "started", nil, func(context.Context) ([]byte, error) { panic("x") })
	}()
	cp := crashCopy(t, path)
	require.NoError(t, e.Close())
	ro1, err := OpenFile(cp, &BoltOptions{ReadOnly: true}, &Options{PruneInterval: -1})
	require.NoError(t, err)
	defer ro1.Close()
	ro2, err := OpenFile(cp, &BoltOptions{ReadOnly: true}, &Options{PruneInterval: -1})
	require.NoError(t, err, "a second read-only open shares the file")
	defer ro2.Close()
	for _, ro := range []*Engine{ro1, ro2} {
		res, err := ro.Do(ctx, "done", nil, func(context.Context) ([]byte, error) { panic("ran") })
		require.NoError(t, err)
		require.Equal(t, "d", string(res.Response))
		for _, k := range []string{"started", "new"} {
			_, err = ro.Do(ctx, k, nil, func(context.Context) ([]byte, error) { panic("ran " + k) })
			require.ErrorIs(t, err, bbolterrors.ErrDatabaseReadOnly, k)
		}
		require.ErrorIs(t, ro.Forget("done"), bbolterrors.ErrDatabaseReadOnly)
		r, err := ro.Get("started")
		require.NoError(t, err)
		require.Equal(t, StateStarted, r.State)
	}
}

// The file reached through a symbolic link (a common deployment layout:
// app/idem.db -> /data/idem.db): the journal goes beside the link, so an
// open of the file by its own path, after a crash, misses every write the
// journal held, and the keys run again as new.
func TestBreakJournalBesideASymlinkNotTheFile(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	real := filepath.Join(dir, "data", "idem.db")
	require.NoError(t, os.Mkdir(filepath.Dir(real), 0o700))
	link := filepath.Join(dir, "idem.db")
	e := openNoCheckpoint(t, real, nil)
	require.NoError(t, e.Close()) // the file exists
	require.NoError(t, os.Symlink(real, link))
	e = openNoCheckpoint(t, link, nil)
	_, err := e.Do(ctx, "k", nil, func(context.Context) ([]byte, error) { return []byte("charged"), nil })
	require.NoError(t, err)
	// The process dies: the crash copy keeps the same layout.
	dir2 := t.TempDir()
	real2 := filepath.Join(dir2, "data", "idem.db")
	require.NoError(t, os.Mkdir(filepath.Dir(real2), 0o700))
	copyFile(t, real, real2)
	require.NoError(t, os.Symlink(real2, filepath.Join(dir2, "idem.db")))
	copied := crashCopy(t, link) // copy.db and copy.db.journal
	require.NoError(t, os.Rename(journalDir(copied), journalDir(filepath.Join(dir2, "idem.db"))))
	require.NoError(t, e.Close())

	e2, err := OpenFile(real2, nil, &Options{PruneInterval: -1})
	require.NoError(t, err)
	defer e2.Close()
	res, err := e2.Do(ctx, "k", nil, func(context.Context) ([]byte, error) { return []byte("charged again"), nil })
	require.NoError(t, err)
	require.Equal(t, "charged", string(res.Response), "the answer given before the crash replays, whichever path names the file")
}

// A random mix of Do, Forget, Resolve, Prune and big responses, with crash
// copies taken along the way: each copy, opened read-only and then for
// writing, holds exactly the answers given before it was taken.
func TestBreakJournalModelAcrossCrashes(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(20, 26))
	path := filepath.Join(t.TempDir(), "j.db")
	e := openNoCheckpointOpts(t, path, &BoltOptions{JournalSize: 2 * segmentSize}, bigOpts)
	model := map[string]string{}
	type snap struct {
		path  string
		model map[string]string
	}
	var snaps []snap
	for op := range 400 {
		k := "k" + strconv.Itoa(rng.IntN(30))
		switch r := rng.IntN(20); {
		case r < 12:
			resp := fmt.Sprintf("r%d", op)
			if rng.IntN(10) == 0 {
				resp += strings.Repeat("x", rng.IntN(1500<<10))
			}
			res, err := e.Do(ctx, k, nil, func(context.Context) ([]byte, error) { return []byte(resp), nil })
			require.NoError(t, err)
			if want, ok := model[k]; ok {
				require.Equal(t, want, string(res.Response), "op %d %s", op, k)
			} else {
				model[k] = resp
			}
		case r < 15:
			err := e.Forget(k)
			if _, ok := model[k]; ok {
				require.NoError(t, err)
			}
			delete(model, k)
		case r < 16:
			if _, ok := model[k]; !ok {
				func() {
					defer func() { _ = recover() }()
					_, _ = e.Do(ctx, k, nil, func(context.Context) ([]byte, error) { panic("interrupted") })
				}()
				require.NoError(t, e.Resolve(k, []byte("resolved"), nil), "op %d", op)
				model[k] = "resolved"
			}
		case r < 17:
			_, err := e.Prune(ctx)
			require.NoError(t, err)
		case r < 18:
			if rng.IntN(2) == 0 {
				e.b.j.delay.Store(int64(time.Millisecond)) // let a checkpoint run
			} else {
				e.b.j.delay.Store(int64(time.Hour))
			}
		default:
			if _, err := os.Stat(journalDir(path)); err != nil {
				continue // no journal yet
			}
			snaps = append(snaps, snap{crashCopy(t, path), maps.Clone(model)})
		}
	}
	require.NoError(t, e.Close())
	require.NotEmpty(t, snaps)
	for i, s := range snaps {
		for _, ro := range []bool{true, false} {
			e, err := OpenFile(s.path, &BoltOptions{ReadOnly: ro}, bigOpts)
			require.NoError(t, err)
			got := map[string]string{}
			require.NoError(t, e.Records(func(r *Record, err error) error {
				require.NoError(t, err)
				require.Equal(t, StateDone, r.State, r.Key)
				got[r.Key] = string(r.Response)
				return nil
			}))
			require.Equal(t, len(s.model), len(got), "snapshot %d, read-only %v", i, ro)
			for k, v := range s.model {
				require.Equal(t, v, got[k], "snapshot %d, read-only %v, %s", i, ro, k)
			}
			require.NoError(t, e.Close())
		}
	}
}

// Backup while callers write through the journal: the copy holds every
// answer given before Backup began, and needs no journal.
func TestBreakJournalBackupUnderLoad(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "j.db")
	e := openNoCheckpoint(t, path, &BoltOptions{JournalSize: 2 * segmentSize})
	defer e.Close()
	var (
		mu    sync.Mutex
		acked = map[string]bool{}
		stop  atomic.Bool
		wg    sync.WaitGroup
	)
	for g := range 8 {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				k := fmt.Sprintf("g%d-%d", g, i)
				_, err := e.Do(ctx, k, nil, func(context.Context) ([]byte, error) { return bytes.Repeat([]byte("v"), 2000), nil })
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				acked[k] = true
				mu.Unlock()
			}
		})
	}
	for round := range 5 {
		time.Sleep(20 * time.Millisecond)
		mu.Lock()
		before := maps.Clone(acked)
		mu.Unlock()
		dst := filepath.Join(t.TempDir(), fmt.Sprintf("b%d.db", round))
		require.NoError(t, e.BackupFile(dst))
		b, err := OpenFile(dst, &BoltOptions{ReadOnly: true}, nil)
		require.NoError(t, err)
		for k := range before {
			_, err := b.Get(k)
			require.NoError(t, err, "round %d: %s was answered before the backup began", round, k)
		}
		require.NoError(t, b.Close())
	}
	stop.Store(true)
	wg.Wait()
}

// A file whose journal directory cannot be made (in a directory the program
// may not create entries in: a pre-created file in a root-owned directory, a
// single-file mount; here, as a stand-in any user can build, a dangling
// symlink in its place): Open succeeds, then the first Do fails the engine
// closed, and every later call, Get included, fails; reopening does not help.
// Expected: Open fails with the journal's error (or the engine runs without
// the journal), not a fail-closed engine.
func TestBreakJournalDirCannotBeMade(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "idem.db")
	e, err := Open(path, &Options{PruneInterval: -1})
	require.NoError(t, err)
	require.NoError(t, e.Close())
	require.NoError(t, os.Symlink(filepath.Join(dir, "nowhere", "journal"), journalDir(path)))

	e, err = Open(path, &Options{PruneInterval: -1})
	if err != nil {
		return // refused at Open: the expected behaviour
	}
	defer e.Close()
	_, err = e.Do(context.Background(), "a", nil, func(context.Context) ([]byte, error) { return []byte("r"), nil })
	require.NoError(t, err, "Open succeeded, so Do should work")
}

// RecoverRefuse with the interrupted execution only in the journal: after
// the crash, the key is refused until resolved.
func TestBreakJournalRefuseAcrossCrash(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "j.db")
	e := openNoCheckpointOpts(t, path, nil, &Options{PruneInterval: -1, Recovery: RecoverRefuse})
	func() {
		defer func() { _ = recover() }()
		_, _ = e.Do(ctx, "k", nil, func(context.Context) ([]byte, error) { panic("x") })
	}()
	cp := crashCopy(t, path)
	require.NoError(t, e.Close())
	e2, err := OpenFile(cp, nil, &Options{PruneInterval: -1, Recovery: RecoverRefuse})
	require.NoError(t, err)
	defer e2.Close()
	r, err := e2.Get("k")
	require.NoError(t, err)
	require.True(t, r.KeptUntilResolved)
	_, err = e2.Do(ctx, "k", nil, func(context.Context) ([]byte, error) { return []byte("ran"), nil })
	require.ErrorIs(t, err, ErrIncomplete)
	require.NoError(t, e2.Resolve("k", []byte("resolved"), nil))
	res, err := e2.Do(ctx, "k", nil, func(context.Context) ([]byte, error) { return []byte("ran"), nil })
	require.NoError(t, err)
	require.Equal(t, "resolved", string(res.Response))
}

// InFlightFail: duplicates of a running key fail at once, whatever group
// they share with it.
func TestBreakJournalInFlightFail(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "j.db")
	e := openNoCheckpointOpts(t, path, nil, &Options{PruneInterval: -1, InFlight: InFlightFail})
	defer e.Close()
	release := make(chan struct{})
	started := make(chan struct{})
	var runs atomic.Int32
	go func() {
		_, _ = e.Do(ctx, "k", nil, func(context.Context) ([]byte, error) {
			runs.Add(1)
			close(started)
			<-release
			return []byte("r"), nil
		})
	}()
	<-started
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			_, err := e.Do(ctx, "k", nil, func(context.Context) ([]byte, error) { runs.Add(1); return nil, nil })
			require.ErrorIs(t, err, ErrInProgress)
		})
	}
	wg.Wait()
	close(release)
	require.Eventually(t, func() bool { r, err := e.Get("k"); return err == nil && r.State == StateDone }, 5*time.Second, time.Millisecond)
	require.EqualValues(t, 1, runs.Load())
}

// Frames at a segment's size, either side of it: each is durable (in a
// segment or committed directly), a crash copy replays them all.
func TestBreakJournalFrameAtSegmentSize(t *testing.T) {
	path := filepath.Join(t.TempDir(), "j.db")
	e := openNoCheckpoint(t, path, &BoltOptions{JournalSize: 2 * segmentSize})
	bucket := timeSlot{Start: 0, End: 1}.Name()
	overhead := len(appendBatch(nil, []mutation{{bucket: bucket, key: []byte("k00"), value: nil}}))
	want := map[string]int{}
	i := 0
	for _, frame := range []int{segmentSize, segmentSize - 8, segmentSize + 8, segmentSize, 100, segmentSize - frameHeader, segmentSize} {
		n := frame - frameHeader - overhead - 4 // the value's uvarint length grows to 3 bytes
		for frameSize(len(appendBatch(nil, []mutation{{bucket: bucket, key: []byte("k00"), value: make([]byte, n)}}))) < frame {
			n++
		}
		k := fmt.Sprintf("k%02d", i)
		i++
		want[k] = n
		v := bytes.Repeat([]byte{byte(i)}, n)
		require.NoError(t, e.b.j.do(func(w *jtx) error { return w.put(bucket, []byte(k), v) }), "frame of %d bytes", frame)
	}
	cp := crashCopy(t, path)
	require.NoError(t, e.Close())
	e2, err := OpenFile(cp, nil, &Options{PruneInterval: -1})
	require.NoError(t, err)
	defer e2.Close()
	require.NoError(t, e2.b.db.View(func(tx *bbolt.Tx) error {
		for k, n := range want {
			require.Len(t, boltGet(tx, bucket, []byte(k)), n, k)
		}
		return nil
	}))
}

// Damage to the last frame of the first of two segments is damage (the
// second holds later frames), not a torn tail.
func TestBreakJournalDamageAcrossSegments(t *testing.T) {
	path := filepath.Join(t.TempDir(), "j.db")
	e := openNoCheckpoint(t, path, &BoltOptions{JournalSize: 4 * segmentSize})
	bucket := timeSlot{Start: 0, End: 1}.Name()
	v := make([]byte, 100<<10)
	for i := range 14 { // 1.4 MiB: two segments
		require.NoError(t, e.b.j.do(func(w *jtx) error { return w.put(bucket, []byte{byte(i)}, v) }))
	}
	cp := crashCopy(t, path)
	require.NoError(t, e.Close())
	ents, err := os.ReadDir(journalDir(cp))
	require.NoError(t, err)
	require.Len(t, ents, 2)
	first := filepath.Join(journalDir(cp), ents[0].Name())
	data, err := os.ReadFile(first)
	require.NoError(t, err)
	last := 0
	for off := 0; binary.LittleEndian.Uint32(data[off:]) != 0; off += frameSize(int(binary.LittleEndian.Uint32(data[off:]))) {
		last = off
	}
	flip(t, first, last+frameHeader+50)
	_, err = OpenFile(cp, nil, &Options{PruneInterval: -1})
	require.ErrorIs(t, err, ErrCorrupt)
}
