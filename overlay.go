package idem

import (
	"bytes"
	"cmp"
	"slices"
	"sync"
	"sync/atomic"

	"go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// The overlay: the acknowledged writes bbolt does not hold yet. A write the
// journal made durable (journal.go) is applied here before its caller is
// answered, and dropped once a checkpoint (checkpoint.go) committed it to
// bbolt, so every reader (a replay's Lookup, Get, Records, ScanFile, the
// writers' own reads) that consults the overlay before bbolt sees every
// acknowledged write at once.
//
// Consistency: an entry leaves the overlay only after the bbolt commit that
// holds it, and only under mu's write lock. A reader holds the read lock from
// its first look at the overlay until its bbolt read transaction has begun,
// so whatever it misses in the overlay is in the bbolt state it then reads;
// what it finds in the overlay is newer than any bbolt state. A long walk
// (Records) copies what it needs (snapshot) and lets go of the lock once its
// transaction has begun.
//
// Its memory is bounded by the journal's (BoltOptions.JournalSize): every
// entry came from a frame no checkpoint has covered, and holds no more bytes
// than the frame carried for it.
type overlay struct {
	mu      sync.RWMutex
	buckets map[string]map[string]*oentry
	last    uint64 // the sequence number of the last frame applied

	n atomic.Int64 // entries: a reader skips an empty overlay without mu
}

// oentry is the newest acknowledged write of a key: its value, or a delete.
type oentry struct {
	value []byte
	del   bool
	seq   uint64 // the frame that wrote it
}

func newOverlay() *overlay { return &overlay{buckets: make(map[string]map[string]*oentry)} }

// empty reports whether the overlay holds nothing, without the lock.
func (o *overlay) empty() bool { return o.n.Load() == 0 }

// get returns the entry of key in bucket, or nil. The caller holds mu.
func (o *overlay) get(bucket, key []byte) *oentry {
	if b := o.buckets[string(bucket)]; b != nil {
		return b[string(key)]
	}
	return nil
}

// apply records the writes of frame seq, in order. The caller holds mu's
// write lock; ms's slices are the overlay's from now on.
func (o *overlay) apply(seq uint64, ms []mutation) {
	for _, m := range ms {
		b := o.buckets[string(m.bucket)]
		if b == nil {
			b = make(map[string]*oentry)
			o.buckets[string(m.bucket)] = b
		}
		if b[string(m.key)] == nil {
			o.n.Add(1)
		}
		b[string(m.key)] = &oentry{value: m.value, del: m.del, seq: seq}
	}
	o.last = max(o.last, seq)
}

// drop removes the entries a checkpoint at upTo covers: written by frames at
// or before it. The caller holds mu's write lock.
func (o *overlay) drop(upTo uint64) {
	for name, b := range o.buckets {
		for k, e := range b {
			if e.seq <= upTo {
				delete(b, k)
				o.n.Add(-1)
			}
		}
		if len(b) == 0 {
			delete(o.buckets, name)
		}
	}
}

// kv is one key of a bucket's snapshot, with its entry.
type kv struct {
	key string
	e   *oentry
}

// bucketSnap is a bucket's entries, by key.
type bucketSnap struct {
	name string
	kvs  []kv
}

// snapshot copies the entries of the buckets keep selects (all, if nil),
// by bucket name and by key. The caller holds mu.
func (o *overlay) snapshot(keep func(name []byte) bool) []bucketSnap {
	var out []bucketSnap
	for name, b := range o.buckets {
		if keep != nil && !keep([]byte(name)) {
			continue
		}
		s := bucketSnap{name: name, kvs: make([]kv, 0, len(b))}
		for k, e := range b {
			s.kvs = append(s.kvs, kv{k, e})
		}
		slices.SortFunc(s.kvs, func(a, b kv) int { return cmp.Compare(a.key, b.key) })
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b bucketSnap) int { return cmp.Compare(a.name, b.name) })
	return out
}

// mergeBucket calls fn for every key of bucket bk (nil for none) merged with
// the snapshot's entries of the same bucket (nil for none), by key: an entry
// replaces bbolt's value, a delete hides it. Nested buckets (a nil value in
// bbolt) are skipped.
func mergeBucket(bk *bbolt.Bucket, snap []kv, fn func(k, v []byte) error) error {
	var c *bbolt.Cursor
	var k, v []byte
	if bk != nil {
		c = bk.Cursor()
		k, v = c.First()
	}
	i := 0
	for k != nil || i < len(snap) {
		var (
			cmp int
			ok  bool
		)
		switch {
		case k == nil:
			cmp = 1
		case i == len(snap):
			cmp = -1
		default:
			cmp = bytes.Compare(k, []byte(snap[i].key))
		}
		var ck, cv []byte
		switch {
		case cmp < 0: // bbolt's alone
			ck, cv, ok = k, v, v != nil
			k, v = c.Next()
		default: // the overlay's, over bbolt's if it has the key
			e := snap[i]
			i++
			ck, cv, ok = []byte(e.key), e.e.value, !e.e.del
			if cmp == 0 {
				k, v = c.Next()
			}
		}
		if ok {
			if err := fn(ck, cv); err != nil {
				return err
			}
		}
	}
	return nil
}

// ovRead is a reader's recTx: the overlay over a read transaction. The
// reader holds the overlay's read lock while it reads; it writes nothing.
type ovRead struct {
	ov *overlay
	tx *bbolt.Tx
}

func (r ovRead) get(bucket, key []byte) []byte {
	if e := r.ov.get(bucket, key); e != nil {
		return e.value
	}
	return boltGet(r.tx, bucket, key)
}

func (ovRead) put(_, _, _ []byte) error { return bolterrors.ErrTxNotWritable }
func (ovRead) del(_, _ []byte) error    { return bolterrors.ErrTxNotWritable }

// isSlotName reports whether a bucket name is a time slot's.
func isSlotName(name []byte) bool { _, ok := parseSlot(name); return ok }

// viewRecords runs fn in a read transaction, over the overlay (held for
// fn's whole run: a short read).
func (b *boltBackend) viewRecords(fn func(tx recTx) error) error {
	if b.ov.empty() {
		return view(b.db, func(tx *bbolt.Tx) error { return fn(boltRec{tx}) })
	}
	b.ov.mu.RLock()
	defer b.ov.mu.RUnlock()
	return view(b.db, func(tx *bbolt.Tx) error { return fn(ovRead{b.ov, tx}) })
}

// viewSnapshot runs fn in a read transaction, with the snapshot of the
// overlay's slot buckets taken before it began (viewUser's inUser).
func (b *boltBackend) viewSnapshot(inUser *bool, fn func(tx *bbolt.Tx, snap []bucketSnap) error) error {
	if b.ov.empty() {
		return viewUser(b.db, inUser, func(tx *bbolt.Tx) error { return fn(tx, nil) })
	}
	b.ov.mu.RLock()
	locked := true
	defer func() {
		if locked {
			b.ov.mu.RUnlock()
		}
	}()
	snap := b.ov.snapshot(isSlotName)
	return viewUser(b.db, inUser, func(tx *bbolt.Tx) error {
		b.ov.mu.RUnlock() // begun: what leaves the overlay now is in tx
		locked = false
		return fn(tx, snap)
	})
}
