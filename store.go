package idem

import (
	"encoding/binary"
	"fmt"
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
type store struct {
	slotWidth time.Duration

	// slots lists the slot buckets of the file, oldest first, or a superset:
	// a slot is added before the commit that may create it and removed after
	// the commit that dropped it, so a lookup that opens only these never
	// misses a record, and needs no cursor over the root bucket.
	slots   atomic.Pointer[[]uint64]
	slotsMu sync.Mutex // serialises writers of slots
}

// loadSlots reads the list of slot buckets at Open.
func (s *store) loadSlots(tx *bbolt.Tx) error {
	var list []uint64
	err := s.forEachSlot(tx, func(i uint64, _ *bbolt.Bucket) error {
		list = append(list, i)
		return nil
	})
	s.slots.Store(&list)
	return err
}

func (s *store) knownSlots() []uint64 {
	if p := s.slots.Load(); p != nil {
		return *p
	}
	return nil
}

// addSlot adds slot i to the list if it is not there yet.
func (s *store) addSlot(i uint64) {
	if slices.Contains(s.knownSlots(), i) {
		return
	}
	s.slotsMu.Lock()
	defer s.slotsMu.Unlock()
	old := s.knownSlots()
	at, found := slices.BinarySearch(old, i)
	if found {
		return
	}
	list := slices.Insert(slices.Clone(old), at, i)
	s.slots.Store(&list)
}

// removeSlot removes slot i from the list, after its bucket was dropped.
func (s *store) removeSlot(i uint64) {
	s.slotsMu.Lock()
	defer s.slotsMu.Unlock()
	list := slices.DeleteFunc(slices.Clone(s.knownSlots()), func(j uint64) bool { return j == i })
	s.slots.Store(&list)
}

// initFile creates the engine's buckets in a new file, or checks the format
// version of an existing one. It returns the slot width recorded in the file.
// A read-only open only checks, and refuses a file that has no idem bucket.
func initFile(db *bbolt.DB, retention time.Duration, readOnly bool) (width time.Duration, err error) {
	if readOnly {
		err = db.View(func(tx *bbolt.Tx) error {
			root := tx.Bucket(layout.Root)
			if width, err = checkMeta(root); err != nil {
				return err
			}
			for _, name := range [][]byte{layout.Outbox, layout.Dead} {
				if root.Bucket(name) == nil {
					return fmt.Errorf("%w: bucket %q has no %q bucket", ErrFormat, layout.Root, name)
				}
			}
			return nil
		})
		return width, err
	}
	err = db.Update(func(tx *bbolt.Tx) error {
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
			if err := meta.Put(layout.SlotWidth, layout.U64(uint64(retention))); err != nil {
				return err
			}
		}
		if width, err = checkMeta(root); err != nil {
			return err
		}
		for _, name := range [][]byte{layout.Outbox, layout.Dead} {
			if _, err := root.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		return nil
	})
	return width, err
}

// checkMeta checks the format version in root's meta bucket and returns the
// slot width.
func checkMeta(root *bbolt.Bucket) (time.Duration, error) {
	if root == nil {
		return 0, fmt.Errorf("%w: not an idem file (no %q bucket)", ErrFormat, layout.Root)
	}
	meta := root.Bucket(layout.Meta)
	if meta == nil {
		return 0, fmt.Errorf("%w: bucket %q has no meta bucket", ErrFormat, layout.Root)
	}
	v := meta.Get(layout.VersionK)
	if len(v) != 4 {
		return 0, fmt.Errorf("%w: no format version recorded", ErrFormat)
	}
	if got := binary.BigEndian.Uint32(v); got != layout.Version {
		return 0, fmt.Errorf("%w: file has format version %d, this build reads version %d", ErrFormat, got, layout.Version)
	}
	w, ok := layout.ParseU64(meta.Get(layout.SlotWidth))
	if !ok || w == 0 {
		return 0, fmt.Errorf("%w: bad slot width", ErrFormat)
	}
	return time.Duration(w), nil
}

func rootBucket(tx *bbolt.Tx) *bbolt.Bucket { return tx.Bucket(layout.Root) }

// firstSlot and nextSlot walk the slot buckets from the oldest.
func firstSlot(c *bbolt.Cursor) (name []byte, i uint64) {
	k, _ := c.Seek(layout.SlotPrefix)
	if i, ok := layout.ParseSlot(k); ok {
		return k, i
	}
	return nil, 0
}

func nextSlot(c *bbolt.Cursor) (name []byte, i uint64) {
	k, _ := c.Next()
	if i, ok := layout.ParseSlot(k); ok {
		return k, i
	}
	return nil, 0
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

// rawLookup finds the newest stored value of key: the slots newest first,
// stopping at slots that can hold only records older than horizon (a zero
// horizon searches every slot). The value points into the mmap.
func (s *store) rawLookup(tx *bbolt.Tx, key []byte, horizon time.Time) []byte {
	root := rootBucket(tx)
	slots := s.knownSlots()
	for j := len(slots) - 1; j >= 0; j-- {
		if !layout.SlotEnd(slots[j], s.slotWidth).After(horizon) {
			return nil
		}
		if b := root.Bucket(layout.SlotName(slots[j])); b != nil {
			if v := b.Get(key); v != nil {
				return v
			}
		}
	}
	return nil
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

// put stores r in its slot. replaces is the version of the key it supersedes,
// if any: deleted when it sits in another slot, so a key has one version.
func (s *store) put(tx *bbolt.Tx, r *Record, replaces *Record) error {
	slot := layout.SlotIndex(slotTime(r), s.slotWidth)
	if replaces != nil {
		if old := layout.SlotIndex(slotTime(replaces), s.slotWidth); old != slot {
			if err := s.delFrom(tx, old, r.Key); err != nil {
				return err
			}
		}
	}
	s.addSlot(slot)
	b, err := rootBucket(tx).CreateBucketIfNotExists(layout.SlotName(slot))
	if err != nil {
		return err
	}
	return b.Put([]byte(r.Key), encodeRecord(make([]byte, 0, encodedSize(r)), r))
}

// del removes the stored version r of its key.
func (s *store) del(tx *bbolt.Tx, r *Record) error {
	return s.delFrom(tx, layout.SlotIndex(slotTime(r), s.slotWidth), r.Key)
}

func (s *store) delFrom(tx *bbolt.Tx, slot uint64, key string) error {
	if b := rootBucket(tx).Bucket(layout.SlotName(slot)); b != nil {
		return b.Delete([]byte(key))
	}
	return nil
}

// deleteAll removes every stored version of key and reports whether there was one.
func (s *store) deleteAll(tx *bbolt.Tx, key string) (bool, error) {
	k := []byte(key)
	found := false
	err := s.forEachSlot(tx, func(_ uint64, b *bbolt.Bucket) error {
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
	return s.forEachSlot(tx, func(_ uint64, b *bbolt.Bucket) error {
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

// forEachSlot calls fn for every slot bucket, oldest first. fn must not add
// or drop slot buckets.
func (s *store) forEachSlot(tx *bbolt.Tx, fn func(i uint64, b *bbolt.Bucket) error) error {
	root := rootBucket(tx)
	c := root.Cursor()
	for k, i := firstSlot(c); k != nil; k, i = nextSlot(c) {
		b := root.Bucket(k)
		if b == nil {
			continue // a value, not a bucket, under a slot's name: not ours
		}
		if err := fn(i, b); err != nil {
			return err
		}
	}
	return nil
}
