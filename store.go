package idem

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/bbolt"

	"github.com/idemkit/idem/internal/layout"
)

// store is the storage seam: every read and write of records goes through it,
// so the state machine in engine.go does not know the bucket layout. Reads
// take a *bbolt.Tx (read or write); writes run inside commit pipeline
// functions.
//
// Records live in time-slot buckets as wide as the retention window: done
// records by completion time, started ones by start time, so a slot's records
// have all expired a window after the slot ends and the pruner drops it whole.
// A key has one version, in one slot.
type store struct {
	// width is the width of new slots: the retention window. Slots made under
	// another retention keep their own span (it is in their name).
	width time.Duration

	// slots lists the slot buckets of the file by start, or a superset: a
	// slot is added before the commit that may create it and removed after
	// the commit that dropped it, so a lookup that opens only these never
	// misses a record, and needs no cursor over the root bucket.
	slots   atomic.Pointer[[]knownSlot]
	slotsMu sync.Mutex // serialises writers of slots
}

// knownSlot is a slot and its bucket name, built once.
type knownSlot struct {
	layout.Slot
	name []byte
}

// checkLength refuses, before bbolt maps it, a file shorter than the pages
// its newest valid meta page counts: bbolt reads its freelist and pages
// through the memory map, and a read past the end of the file faults and
// kills the program (no recover). A file with no valid meta page is left to
// bbolt, which refuses it with ErrInvalid. The meta page's layout is bbolt's
// (internal/common/meta.go): a 16-byte page header, then magic, version,
// page size, flags, the root bucket (16 bytes), the freelist's page, the
// page count, the transaction id and an FNV-1a checksum of what precedes it.
func checkLength(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return nil // bbolt reports it
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() || fi.Size() == 0 {
		return nil
	}
	meta := func(off int64) (pageSize, pages, txid uint64, ok bool) {
		var b [16 + 64]byte
		if _, err := f.ReadAt(b[:], off); err != nil {
			return 0, 0, 0, false
		}
		m := b[16:]
		h := fnv.New64a()
		h.Write(m[:56])
		if binary.LittleEndian.Uint32(m[0:]) != 0xED0CDAED || h.Sum64() != binary.LittleEndian.Uint64(m[56:]) {
			return 0, 0, 0, false
		}
		return uint64(binary.LittleEndian.Uint32(m[8:])), binary.LittleEndian.Uint64(m[40:]), binary.LittleEndian.Uint64(m[48:]), true
	}
	ps0, pages0, tx0, ok0 := meta(0)
	second := int64(os.Getpagesize())
	if ok0 {
		second = int64(ps0)
	}
	ps1, pages1, tx1, ok1 := meta(second)
	var need uint64
	switch {
	case ok0 && (!ok1 || tx0 >= tx1):
		need = ps0 * pages0
	case ok1:
		need = ps1 * pages1
	default:
		return nil
	}
	if uint64(fi.Size()) < need {
		return fmt.Errorf("%w: the file is cut short (%d bytes, its meta page counts %d); run `idem check` and restore from a backup", ErrCorrupt, fi.Size(), need)
	}
	return nil
}

// initFile creates the engine's buckets in a new file, or checks the format
// version of an existing one. A read-only open only checks, and refuses a file
// that lacks the engine's buckets. A panic of bbolt's on a damaged page
// becomes ErrCorrupt.
func initFile(db *bbolt.DB, readOnly bool) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("%w: the file is damaged (%v); run `idem check` and restore from a backup", ErrCorrupt, v)
		}
	}()
	if readOnly {
		return db.View(func(tx *bbolt.Tx) error {
			root := tx.Bucket(layout.Root)
			if err := checkMeta(root); err != nil {
				return err
			}
			for _, name := range [][]byte{layout.Outbox, layout.Dead} {
				if root.Bucket(name) == nil {
					return fmt.Errorf("%w: bucket %q has no %q bucket", ErrFormat, layout.Root, name)
				}
			}
			return nil
		})
	}
	return db.Update(func(tx *bbolt.Tx) error {
		root := tx.Bucket(layout.Root)
		if root == nil {
			var err error
			if root, err = tx.CreateBucket(layout.Root); err != nil {
				return err
			}
			meta, err := root.CreateBucket(layout.Meta)
			if err != nil {
				return err
			}
			if err := meta.Put(layout.VersionK, binary.BigEndian.AppendUint32(nil, layout.Version)); err != nil {
				return err
			}
		}
		if err := checkMeta(root); err != nil {
			return err
		}
		for _, name := range [][]byte{layout.Outbox, layout.Dead} {
			if _, err := root.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		return nil
	})
}

// checkMeta checks the format version in root's meta bucket.
func checkMeta(root *bbolt.Bucket) error {
	if root == nil {
		return fmt.Errorf("%w: not an idem file (no %q bucket)", ErrFormat, layout.Root)
	}
	meta := root.Bucket(layout.Meta)
	if meta == nil {
		return fmt.Errorf("%w: bucket %q has no meta bucket", ErrFormat, layout.Root)
	}
	v := meta.Get(layout.VersionK)
	if len(v) != 4 {
		return fmt.Errorf("%w: no format version recorded", ErrFormat)
	}
	if got := binary.BigEndian.Uint32(v); got != layout.Version {
		return fmt.Errorf("%w: file has format version %d, this build reads version %d", ErrFormat, got, layout.Version)
	}
	return nil
}

func rootBucket(tx *bbolt.Tx) *bbolt.Bucket { return tx.Bucket(layout.Root) }

// loadSlots reads the list of slot buckets at Open.
func (s *store) loadSlots(tx *bbolt.Tx) error {
	var list []knownSlot
	err := s.forEachSlot(tx, func(sl layout.Slot, _ *bbolt.Bucket) error {
		list = append(list, knownSlot{sl, sl.Name()})
		return nil
	})
	s.slots.Store(&list)
	return err
}

func (s *store) knownSlots() []knownSlot {
	if p := s.slots.Load(); p != nil {
		return *p
	}
	return nil
}

func compareSlots(a knownSlot, b layout.Slot) int {
	if a.Start != b.Start {
		return cmpInt64(a.Start, b.Start)
	}
	return cmpInt64(a.End, b.End)
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// addSlot adds sl to the list if it is not there yet.
func (s *store) addSlot(sl layout.Slot) {
	if _, found := slices.BinarySearchFunc(s.knownSlots(), sl, compareSlots); found {
		return
	}
	s.slotsMu.Lock()
	defer s.slotsMu.Unlock()
	old := s.knownSlots()
	at, found := slices.BinarySearchFunc(old, sl, compareSlots)
	if found {
		return
	}
	list := slices.Insert(slices.Clone(old), at, knownSlot{sl, sl.Name()})
	s.slots.Store(&list)
}

// removeSlot removes sl from the list, after its bucket was dropped.
func (s *store) removeSlot(sl layout.Slot) {
	s.slotsMu.Lock()
	defer s.slotsMu.Unlock()
	list := slices.DeleteFunc(slices.Clone(s.knownSlots()), func(x knownSlot) bool { return x.Slot == sl })
	s.slots.Store(&list)
}

// slotTime is the time that places r in a slot: completion for a done record,
// start for a started one. Either way the record expires one retention window
// after it, so a slot expires whole.
func slotTime(r *Record) time.Time {
	if r.State == StateDone {
		return r.CompletedAt
	}
	return r.StartedAt
}

// find returns the newest stored value of key and its slot, probing the slots
// newest first and skipping those that ended before horizon (a zero horizon
// skips none). The value points into the mmap.
func (s *store) find(tx *bbolt.Tx, key []byte, horizon time.Time) ([]byte, layout.Slot, bool) {
	root := rootBucket(tx)
	slots := s.knownSlots()
	h := horizon.UnixNano()
	for j := len(slots) - 1; j >= 0; j-- {
		sl := slots[j]
		if !horizon.IsZero() && sl.End <= h {
			continue
		}
		if b := root.Bucket(sl.name); b != nil {
			if v := b.Get(key); v != nil {
				return v, sl.Slot, true
			}
		}
	}
	return nil, layout.Slot{}, false
}

// rawLookup is find without the slot.
func (s *store) rawLookup(tx *bbolt.Tx, key []byte, horizon time.Time) []byte {
	v, _, _ := s.find(tx, key, horizon)
	return v
}

// lookup decodes the newest record of key, or returns nil. Whether it is
// expired is the caller's decision.
func (s *store) lookup(tx *bbolt.Tx, key string, horizon time.Time) (*Record, error) {
	v := s.rawLookup(tx, []byte(key), horizon)
	if v == nil {
		return nil, nil
	}
	return decodeRecord(key, v)
}

// put stores r in the slot of its time, and deletes the version of the key
// it supersedes (replaces, if not nil) when that sits in another slot, so a
// key keeps one version.
func (s *store) put(tx *bbolt.Tx, r *Record, replaces *Record) error {
	key := []byte(r.Key)
	sl := layout.SlotAt(slotTime(r), s.width)
	if replaces != nil {
		if _, old, ok := s.find(tx, key, time.Time{}); ok && old != sl {
			if err := s.delFrom(tx, old, key); err != nil {
				return err
			}
		}
	}
	s.addSlot(sl)
	b, err := rootBucket(tx).CreateBucketIfNotExists(sl.Name())
	if err != nil {
		return err
	}
	return b.Put(key, encodeRecord(make([]byte, 0, encodedSize(r)), r))
}

// del removes the stored version of r's key.
func (s *store) del(tx *bbolt.Tx, r *Record) error {
	key := []byte(r.Key)
	if _, sl, ok := s.find(tx, key, time.Time{}); ok {
		return s.delFrom(tx, sl, key)
	}
	return nil
}

func (s *store) delFrom(tx *bbolt.Tx, sl layout.Slot, key []byte) error {
	if b := rootBucket(tx).Bucket(sl.Name()); b != nil {
		return b.Delete(key)
	}
	return nil
}

// deleteAll removes every stored version of key and reports whether there was one.
func (s *store) deleteAll(tx *bbolt.Tx, key string) (bool, error) {
	k := []byte(key)
	found := false
	err := s.forEachSlot(tx, func(_ layout.Slot, b *bbolt.Bucket) error {
		if b.Get(k) != nil {
			found = true
			return b.Delete(k)
		}
		return nil
	})
	return found, err
}

// forEach calls fn for every stored record, slot by slot from the oldest. A
// record that fails to decode is passed as a Record with only Key set,
// beside its error.
func (s *store) forEach(tx *bbolt.Tx, fn func(r *Record, err error) error) error {
	return s.forEachSlot(tx, func(_ layout.Slot, b *bbolt.Bucket) error {
		return b.ForEach(func(k, v []byte) error {
			if v == nil {
				return nil
			}
			r, err := decodeRecord(string(k), v)
			if err != nil {
				r = &Record{Key: string(k)}
			}
			return fn(r, err)
		})
	})
}

// forEachSlot calls fn for every slot bucket in the file, by start. fn must
// not add or drop slot buckets.
func (s *store) forEachSlot(tx *bbolt.Tx, fn func(sl layout.Slot, b *bbolt.Bucket) error) error {
	root := rootBucket(tx)
	c := root.Cursor()
	for k, _ := c.Seek(layout.SlotPrefix); k != nil; k, _ = c.Next() {
		sl, ok := layout.ParseSlot(k)
		if !ok {
			if len(k) < len(layout.SlotPrefix) || string(k[:len(layout.SlotPrefix)]) != string(layout.SlotPrefix) {
				return nil // past the slots
			}
			continue
		}
		b := root.Bucket(k)
		if b == nil {
			continue // a value, not a bucket, under a slot's name: not ours
		}
		if err := fn(sl, b); err != nil {
			return err
		}
	}
	return nil
}
