package idem

import (
	"encoding/binary"
	"fmt"
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
			for _, name := range [][]byte{layout.Slots, layout.Outbox, layout.Dead} {
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
		for _, name := range [][]byte{layout.Slots, layout.Outbox, layout.Dead} {
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

func slotsBucket(tx *bbolt.Tx) *bbolt.Bucket { return rootBucket(tx).Bucket(layout.Slots) }

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
	c := slotsBucket(tx).Cursor()
	for k, _ := c.Last(); k != nil; k, _ = c.Prev() {
		i, ok := layout.ParseU64(k)
		if !ok {
			continue
		}
		if !layout.SlotEnd(i, s.slotWidth).After(horizon) {
			return nil
		}
		if b := c.Bucket().Bucket(k); b != nil {
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
	b, err := slotsBucket(tx).CreateBucketIfNotExists(layout.U64(slot))
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
	if b := slotsBucket(tx).Bucket(layout.U64(slot)); b != nil {
		return b.Delete([]byte(key))
	}
	return nil
}

// deleteAll removes every stored version of key and reports whether there was one.
func (s *store) deleteAll(tx *bbolt.Tx, key string) (bool, error) {
	k := []byte(key)
	found := false
	slots := slotsBucket(tx)
	err := slots.ForEachBucket(func(name []byte) error {
		b := slots.Bucket(name)
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
	slots := slotsBucket(tx)
	return slots.ForEachBucket(func(name []byte) error {
		return slots.Bucket(name).ForEach(func(k, v []byte) error {
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
