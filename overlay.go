package idem

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
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
	// user is DoTx's writes (user buckets, the outbox's messages), by
	// bucket path (pathKey): bucketview.go reads it over bbolt.
	user map[string]*ubucket
	last uint64 // the sequence number of the last frame applied
	// outbox counts the entries under the outbox bucket's path: its
	// readers bring bbolt up to date first while any is here.
	outbox atomic.Int64
	// usern counts the entries of user: DoTx's writes.
	usern atomic.Int64

	n atomic.Int64 // entries: a reader skips an empty overlay without mu
}

// oentry is the newest acknowledged write of a key: its value, or a delete.
type oentry struct {
	value []byte
	del   bool
	seq   uint64 // the frame that wrote it
}

func newOverlay() *overlay {
	return &overlay{buckets: make(map[string]map[string]*oentry), user: make(map[string]*ubucket)}
}

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
		if m.op != 0 {
			o.applyUser(seq, m)
			continue
		}
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
	o.dropUser(upTo)
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

// The overlay's DoTx writes. A bucket path's ubucket holds the newest write
// of each of its keys, its sequence if set, and the bucket's own mark when
// a frame created it (markFresh: nothing of it below this overlay shows) or
// deleted it (markGone). Marking a path drops what the overlay held under
// it: the mark hides it. The same type serves as a DoTx group's pending
// writes and as one call's own (bucketview.go), with seq zero.

const (
	markFresh byte = 1 + iota
	markGone
)

type ubucket struct {
	parent string // the parent's path
	name   string // the last name of the path

	mark byte
	mseq uint64

	keys map[string]*oentry
	// kids is the names of the child buckets marked here.
	kids map[string]struct{}

	hasSeq bool
	seqv   uint64
	sseq   uint64

	// sorted is keys and kids in order, nil when stale: readers holding
	// the overlay's read lock may fill it at once.
	sorted atomic.Pointer[[]string]
}

// entries counts what u holds, as o.n counts it.
func (u *ubucket) entries() int64 {
	n := int64(len(u.keys))
	if u.mark != 0 {
		n++
	}
	if u.hasSeq {
		n++
	}
	return n
}

func (u *ubucket) idle() bool { return u.entries() == 0 && len(u.kids) == 0 }

// names returns the keys and marked kids of u in order (a cursor's
// candidates); its slice is u's until the next write.
func (u *ubucket) names() []string {
	if p := u.sorted.Load(); p != nil {
		return *p
	}
	s := make([]string, 0, len(u.keys)+len(u.kids))
	for k := range u.keys {
		s = append(s, k)
	}
	for k := range u.kids {
		if _, dup := u.keys[k]; !dup {
			s = append(s, k)
		}
	}
	slices.Sort(s)
	u.sorted.Store(&s)
	return s
}

// ub returns path's ubucket, made (with its parents' links) if need be.
func (o *overlay) ub(path string) *ubucket {
	u := o.user[path]
	if u == nil {
		parent, name := splitPath(path)
		u = &ubucket{parent: parent, name: name}
		o.user[path] = u
	}
	return u
}

// count adds d to the entry counts (the outbox's too, for its path).
func (o *overlay) count(path string, d int64) {
	o.n.Add(d)
	o.usern.Add(d)
	if path == outboxPath {
		o.outbox.Add(d)
	}
}

// applyUser records one DoTx write of frame seq.
func (o *overlay) applyUser(seq uint64, m mutation) {
	path := string(m.bucket)
	switch m.op {
	case opUserPut, opUserDelete:
		u := o.ub(path)
		if u.keys == nil {
			u.keys = make(map[string]*oentry)
		}
		if u.keys[string(m.key)] == nil {
			o.count(path, 1)
			u.sorted.Store(nil)
		}
		u.keys[string(m.key)] = &oentry{value: m.value, del: m.op == opUserDelete, seq: seq}
	case opSetSequence:
		u := o.ub(path)
		if !u.hasSeq {
			o.count(path, 1)
		}
		u.hasSeq, u.seqv, u.sseq = true, binary.BigEndian.Uint64(m.value), seq
	case opCreateBucket, opDeleteBucket:
		child := joinPath(path, m.key)
		o.clearUnder(child)
		u := o.ub(child)
		if u.mark == 0 {
			o.count(child, 1)
		}
		u.mark, u.mseq = markFresh, seq
		if m.op == opDeleteBucket {
			u.mark = markGone
		}
		p := o.ub(path)
		if p.kids == nil {
			p.kids = make(map[string]struct{})
		}
		if _, ok := p.kids[string(m.key)]; !ok {
			p.kids[string(m.key)] = struct{}{}
			p.sorted.Store(nil)
		}
	}
	o.last = max(o.last, seq)
}

// clearUnder drops what the overlay holds at path and under it, except
// path's own link in its parent.
func (o *overlay) clearUnder(path string) {
	for p, u := range o.user {
		if !strings.HasPrefix(p, path) {
			continue
		}
		o.count(p, -u.entries())
		if p == path {
			u.keys, u.kids, u.hasSeq, u.mark = nil, nil, false, 0
			u.sorted.Store(nil)
			continue
		}
		delete(o.user, p)
	}
}

// dropUser removes the DoTx writes a checkpoint at upTo covers.
func (o *overlay) dropUser(upTo uint64) {
	for path, u := range o.user {
		for k, e := range u.keys {
			if e.seq <= upTo {
				delete(u.keys, k)
				o.count(path, -1)
				u.sorted.Store(nil)
			}
		}
		if u.hasSeq && u.sseq <= upTo {
			u.hasSeq = false
			o.count(path, -1)
		}
		if u.mark != 0 && u.mseq <= upTo {
			u.mark = 0
			o.count(path, -1)
			if p := o.user[u.parent]; p != nil {
				delete(p.kids, u.name)
				p.sorted.Store(nil)
			}
		}
	}
	for path, u := range o.user {
		if u.idle() {
			delete(o.user, path)
		}
	}
}

// userSnap is a ubucket's state for the checkpoint.
type userSnap struct {
	path   string
	mark   byte
	kvs    []kv
	hasSeq bool
	seqv   uint64
}

// snapshotUser copies the DoTx writes, parents before their children. The
// caller holds mu.
func (o *overlay) snapshotUser() []userSnap {
	out := make([]userSnap, 0, len(o.user))
	for path, u := range o.user {
		s := userSnap{path: path, mark: u.mark, hasSeq: u.hasSeq, seqv: u.seqv}
		for _, k := range u.names() {
			if e := u.keys[k]; e != nil {
				s.kvs = append(s.kvs, kv{k, e})
			}
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b userSnap) int { return cmp.Compare(a.path, b.path) })
	return out
}

// settle brings bbolt up to date with the overlay's DoTx writes (a
// checkpoint) for a reader that reads bbolt alone: View and ScanFile, and
// with outboxOnly the outbox's readers, while messages are pending in the
// overlay. A read-only engine over a journal the file lacks cannot: it
// refuses, with an error matching bbolt's errors.ErrDatabaseReadOnly.
func (b *boltBackend) settle(outboxOnly bool) error {
	n := b.ov.usern.Load()
	if outboxOnly {
		n = b.ov.outbox.Load()
	}
	switch {
	case n == 0:
		return nil
	case b.j == nil:
		return fmt.Errorf("the journal holds DoTx writes the file does not yet; open it for writing once, which replays them: %w", bolterrors.ErrDatabaseReadOnly)
	}
	return storageErr(b.j.drain(), b.maxSize)
}
