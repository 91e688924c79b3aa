package idem

import (
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/bbolt"
)

// store is the storage seam: every read and write of records goes through it,
// so the state machine in engine.go does not know the bucket layout. Reads
// and writes of one record take a recTx: bbolt's write transaction
// (boltRec, in the commit pipeline), a journal group's view (jtx,
// journal.go), or a reader's view of the overlay over a read transaction
// (ovRead, overlay.go); walks take a *bbolt.Tx and the overlay's snapshot.
//
// Records live in time-slot buckets as wide as the retention window: done
// records by completion time, started ones by start time, so a slot's records
// have all expired a window after the slot ends and the pruner drops it whole.
// A key has one version, in one slot.
type store struct {
	// width is the retention window of the records this engine writes, and
	// so the width of the slots it makes (a record sits in a slot as wide as
	// its own window). Slots of other widths keep their span in their name.
	width time.Duration
	// refuse: started records are written kept until resolved
	// (RecoverRefuse).
	refuse bool

	// slots lists the slot buckets of the file by start, or a superset: a
	// slot is added before the commit that may create it and removed after
	// the commit that dropped it, so a lookup that opens only these never
	// misses a record, and needs no cursor over the root bucket.
	slots   atomic.Pointer[[]knownSlot]
	slotsMu sync.Mutex // serialises writers of slots
}

func rootBucket(tx *bbolt.Tx) *bbolt.Bucket { return tx.Bucket(rootName) }

// recTx reads and writes values of the buckets directly under the engine's
// root bucket. get's value is read-only and valid while the transaction
// is; put takes its slices as they are (the caller gives them up).
type recTx interface {
	get(bucket, key []byte) []byte
	put(bucket, key, value []byte) error
	del(bucket, key []byte) error
}

// boltRec is a recTx over a bbolt transaction.
type boltRec struct{ tx *bbolt.Tx }

func (r boltRec) get(bucket, key []byte) []byte { return boltGet(r.tx, bucket, key) }
func (r boltRec) put(bucket, key, value []byte) error {
	return applyMutation(r.tx, bucket, key, value, false)
}
func (r boltRec) del(bucket, key []byte) error { return applyMutation(r.tx, bucket, key, nil, true) }

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
// skips none). The value points into the mmap, or, for a version-1 record, is
// its version-2 encoding with the slot's width as its window.
func (s *store) find(tx recTx, key []byte, horizon time.Time) ([]byte, timeSlot, bool) {
	slots := s.knownSlots()
	h := horizon.UnixNano()
	for j := len(slots) - 1; j >= 0; j-- {
		sl := slots[j]
		if !horizon.IsZero() && sl.End <= h {
			continue
		}
		if v := tx.get(sl.name, key); v != nil {
			return upgradeRecord(key, v, sl.Width()), sl.timeSlot, true
		}
	}
	return nil, timeSlot{}, false
}

// rawLookup is find without the slot.
func (s *store) rawLookup(tx recTx, key []byte, horizon time.Time) []byte {
	v, _, _ := s.find(tx, key, horizon)
	return v
}

// lookup decodes the newest record of key, or returns nil. Whether it is
// expired is the caller's decision.
func (s *store) lookup(tx recTx, key string, horizon time.Time) (*Record, error) {
	v := s.rawLookup(tx, []byte(key), horizon)
	if v == nil {
		return nil, nil
	}
	return decodeRecord(key, v)
}

// put stores r in the slot of its time, and deletes the version of the key
// it supersedes (replaces, if not nil) when that sits in another slot, so a
// key keeps one version.
//
// It writes what the retention rule needs with r: its window, the longer of
// r.Retention (a record written before, put back or resolved, keeps its own)
// and this engine's; and, for a started record, the mark kept until resolved
// under RecoverRefuse. A started record that supersedes a started one (a
// recovering attempt) inherits its window and mark: the evidence of the
// first unknown outcome lasts as long as it would have. The record sits in a
// slot as wide as its window, so the slot expires by its end plus its width.
func (s *store) put(tx recTx, r *Record, replaces *Record) error {
	key := []byte(r.Key)
	w := *r
	w.Retention = max(r.Retention, s.width)
	w.KeptUntilResolved = r.State == StateStarted && (r.KeptUntilResolved || s.refuse)
	if r.State == StateStarted && replaces != nil && replaces.State == StateStarted {
		w.Retention = max(w.Retention, replaces.Retention)
		w.KeptUntilResolved = w.KeptUntilResolved || replaces.KeptUntilResolved
	}
	// The slot of r's time, or of the record it replaces if that is later:
	// a record put back (an interrupted execution restored after the call
	// that recovered it failed before fn ran) goes to a recent slot, never
	// to an old one that the pruner may be dropping as empty meanwhile. A
	// later slot only delays reclaiming the record, never its expiry.
	at := slotTime(r)
	if replaces != nil && slotTime(replaces).After(at) {
		at = slotTime(replaces)
	}
	sl := slotAt(at, w.Retention)
	if replaces != nil {
		if _, old, ok := s.find(tx, key, time.Time{}); ok && old != sl {
			if err := s.delFrom(tx, old, key); err != nil {
				return err
			}
		}
	}
	s.addSlot(sl)
	return tx.put(sl.Name(), key, encodeRecord(make([]byte, 0, encodedSize(&w)), &w))
}

// del removes the stored version of r's key.
func (s *store) del(tx recTx, r *Record) error {
	key := []byte(r.Key)
	if _, sl, ok := s.find(tx, key, time.Time{}); ok {
		return s.delFrom(tx, sl, key)
	}
	return nil
}

func (s *store) delFrom(tx recTx, sl timeSlot, key []byte) error { return tx.del(sl.Name(), key) }

// deleteAll removes every stored version of key and reports whether there was one.
func (s *store) deleteAll(tx *bbolt.Tx, key string) (bool, error) {
	k := []byte(key)
	found := false
	err := s.forEachSlot(tx, func(_ timeSlot, b *bbolt.Bucket) error {
		if b.Get(k) != nil {
			found = true
			return b.Delete(k)
		}
		return nil
	})
	return found, err
}

// forEach calls fn for every stored record, slot by slot from the oldest, by
// key within a slot: bbolt's in tx, merged with snap, the overlay's slot
// buckets taken before tx began (overlay.go; nil for none). A record that
// fails to decode is passed as a Record with only Key set, beside its error.
// A version-1 record gets its slot's width as its window.
func (s *store) forEach(tx *bbolt.Tx, snap []bucketSnap, fn func(r *Record, err error) error) error {
	slot := func(sl timeSlot, b *bbolt.Bucket, kvs []kv) error {
		return mergeBucket(b, kvs, func(k, v []byte) error {
			r, err := decodeRecord(string(k), v)
			if err != nil {
				r = &Record{Key: string(k)}
			} else if v[0] == recordVersionV1 {
				r.Retention = sl.Width()
			}
			return fn(r, err)
		})
	}
	// The snapshot's slots before name (all, if nil), which bbolt lacks.
	before := func(name []byte) error {
		for len(snap) > 0 && (name == nil || snap[0].name < string(name)) {
			if sl, ok := parseSlot([]byte(snap[0].name)); ok {
				if err := slot(sl, nil, snap[0].kvs); err != nil {
					return err
				}
			}
			snap = snap[1:]
		}
		return nil
	}
	err := s.forEachSlot(tx, func(sl timeSlot, b *bbolt.Bucket) error {
		name := sl.Name()
		if err := before(name); err != nil {
			return err
		}
		var kvs []kv
		if len(snap) > 0 && snap[0].name == string(name) {
			kvs, snap = snap[0].kvs, snap[1:]
		}
		return slot(sl, b, kvs)
	})
	if err != nil {
		return err
	}
	return before(nil)
}

// forEachSlot calls fn for every slot bucket in the file, by start. fn must
// not add or drop slot buckets.
func (s *store) forEachSlot(tx *bbolt.Tx, fn func(sl timeSlot, b *bbolt.Bucket) error) error {
	root := rootBucket(tx)
	c := root.Cursor()
	for k, _ := c.Seek(slotPrefix); k != nil; k, _ = c.Next() {
		sl, ok := parseSlot(k)
		if !ok {
			if len(k) < len(slotPrefix) || string(k[:len(slotPrefix)]) != string(slotPrefix) {
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
