package idem

import (
	"bytes"
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
			width, err = checkMeta(tx.Bucket(layout.Root))
			return err
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
		for _, name := range [][]byte{layout.Started, layout.Slots, layout.Outbox, layout.Dead} {
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

// buckets returns the engine's nested buckets in tx; they exist after initFile.
func rootBucket(tx *bbolt.Tx) *bbolt.Bucket { return tx.Bucket(layout.Root) }

func startedBucket(tx *bbolt.Tx) *bbolt.Bucket {
	return rootBucket(tx).Bucket(layout.Started)
}

func slotsBucket(tx *bbolt.Tx) *bbolt.Bucket { return rootBucket(tx).Bucket(layout.Slots) }

// rawLookup finds the newest stored value of key: the started bucket first
// (a started record is always newer than any done one, since completing
// deletes it), then the slots newest first, stopping at slots that can hold
// only records completed before horizon. The value points into the mmap.
func (s *store) rawLookup(tx *bbolt.Tx, key []byte, horizon time.Time) []byte {
	if v := startedBucket(tx).Get(key); v != nil {
		return v
	}
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

// putStarted stores r (state started) in the started bucket.
func (s *store) putStarted(tx *bbolt.Tx, r *Record) error {
	return startedBucket(tx).Put([]byte(r.Key), encodeRecord(make([]byte, 0, encodedSize(r)), r))
}

// putDone stores r (state done) in the slot of its completion time and
// deletes its started record.
func (s *store) putDone(tx *bbolt.Tx, r *Record) error {
	key := []byte(r.Key)
	if err := startedBucket(tx).Delete(key); err != nil {
		return err
	}
	b, err := slotsBucket(tx).CreateBucketIfNotExists(layout.U64(layout.SlotIndex(r.CompletedAt, s.slotWidth)))
	if err != nil {
		return err
	}
	return b.Put(key, encodeRecord(make([]byte, 0, encodedSize(r)), r))
}

// deleteStarted removes key's started record, if any.
func (s *store) deleteStarted(tx *bbolt.Tx, key string) error {
	return startedBucket(tx).Delete([]byte(key))
}

// deleteAll removes every stored version of key and reports whether there was one.
func (s *store) deleteAll(tx *bbolt.Tx, key string) (bool, error) {
	k := []byte(key)
	found := startedBucket(tx).Get(k) != nil
	if err := startedBucket(tx).Delete(k); err != nil {
		return false, err
	}
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

// forEach calls fn for every stored record, started ones first, then done ones
// slot by slot. A record that fails to decode is passed as a Record with only
// Key set, beside its error.
func (s *store) forEach(tx *bbolt.Tx, fn func(r *Record, err error) error) error {
	visit := func(b *bbolt.Bucket) error {
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
	}
	if err := visit(startedBucket(tx)); err != nil {
		return err
	}
	slots := slotsBucket(tx)
	return slots.ForEachBucket(func(name []byte) error {
		return visit(slots.Bucket(name))
	})
}

// keyInSlots is used by tests to find which slot holds a key.
func (s *store) slotOf(tx *bbolt.Tx, key string) (uint64, bool) {
	slots := slotsBucket(tx)
	var found []byte
	_ = slots.ForEachBucket(func(name []byte) error {
		if slots.Bucket(name).Get([]byte(key)) != nil {
			found = bytes.Clone(name)
		}
		return nil
	})
	i, ok := layout.ParseU64(found)
	return i, ok
}
