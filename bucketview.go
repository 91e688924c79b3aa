package idem

import (
	"encoding/binary"
	"fmt"
	"slices"
	"sort"
	"strings"

	"go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// A DoTx fn's view of the file when its writes go through the journal
// (issue 20): bbolt's read transaction under the layers of writes it does
// not hold yet, bottom to top the overlay (acknowledged frames), the writes
// of the calls before this one in its group, and the call's own. Each layer
// is an *overlay (its user part, overlay.go). A read takes a key's newest
// write; a bucket a layer created (markFresh) or deleted (markGone) hides
// what the layers below, and bbolt, hold under its path. The writes are
// checked as bbolt checks them, with bbolt's errors, and go to the top
// layer and to the call's frame (jtx.muts).
//
// A bucket is named by its path: the uvarint length and bytes of each name
// from the top of the file (pathKey). A path's encoding is a prefix of its
// descendants' and of nothing else, so a subtree is a prefix range.

// outboxPath is the path of the engine's outbox bucket: a DoTx's messages
// go through the journal as writes to it.
var outboxPath = pathKey(rootName, outboxName)

// pathKey is the path of the buckets names, from the top of the file.
func pathKey(names ...[]byte) string {
	var b []byte
	for _, n := range names {
		b = binary.AppendUvarint(b, uint64(len(n)))
		b = append(b, n...)
	}
	return string(b)
}

// joinPath is the path of the child name of the bucket at path.
func joinPath(path string, name []byte) string {
	return path + pathKey(name)
}

// nextName reads the first name of a path: the name and the bytes it took.
// n is 0 for a malformed path.
func nextName(path string) (name string, n int) {
	l, k := binary.Uvarint([]byte(path[:min(len(path), binary.MaxVarintLen64)]))
	if k <= 0 || l > uint64(len(path)-k) {
		return "", 0
	}
	return path[k : k+int(l)], k + int(l)
}

// splitPath splits a path into its parent's path and its last name.
func splitPath(path string) (parent, name string) {
	at := 0
	for at < len(path) {
		nm, n := nextName(path[at:])
		if n == 0 {
			return "", ""
		}
		if at+n == len(path) {
			return path[:at], nm
		}
		at += n
	}
	return "", ""
}

// validPath reports whether p is a well-formed path of at least one name, no
// name empty.
func validPath(p []byte) bool {
	s := string(p)
	if s == "" {
		return true // the top of the file (a top-level bucket's parent)
	}
	for s != "" {
		nm, n := nextName(s)
		if n == 0 || nm == "" {
			return false
		}
		s = s[n:]
	}
	return true
}

// names decodes a path.
func pathNames(path string) [][]byte {
	var out [][]byte
	for path != "" {
		nm, n := nextName(path)
		if n == 0 {
			return nil
		}
		out = append(out, []byte(nm))
		path = path[n:]
	}
	return out
}

// uview is a DoTx fn's view: bbolt's read transaction under layers (the
// top one the call's own, which its writes go to).
type uview struct {
	tx     *bbolt.Tx
	layers []*overlay
	emit   func(m mutation) // the write, for the call's frame
}

// at is where a bucket's state comes from: cut is 0 when bbolt's bucket bb
// shows (nil: bbolt has none), else i+1 for the layer i that created it;
// only layers at or above the cut show.
type at struct {
	cut int
	bb  *bbolt.Bucket
}

// child resolves the child name (path cpath) of a bucket resolved as a.
func (v *uview) child(a at, top bool, cpath string, name []byte) (at, bool) {
	for i := len(v.layers); i >= max(a.cut, 1); i-- {
		if u := v.layers[i-1].user[cpath]; u != nil && u.mark != 0 {
			if u.mark == markGone {
				return at{}, false
			}
			return at{cut: i}, true
		}
	}
	if a.cut != 0 {
		return at{}, false // created above bbolt, and this child not since
	}
	var bb *bbolt.Bucket
	switch {
	case top:
		bb = v.tx.Bucket(name)
	case a.bb != nil:
		bb = a.bb.Bucket(name)
	}
	return at{bb: bb}, bb != nil
}

// resolve reports whether the bucket at path exists, and where it comes
// from.
func (v *uview) resolve(path string) (at, bool) {
	var a at
	for end, top := 0, true; end < len(path); top = false {
		nm, n := nextName(path[end:])
		if n == 0 {
			return at{}, false
		}
		end += n
		var ok bool
		if a, ok = v.child(a, top, path[:end], []byte(nm)); !ok {
			return at{}, false
		}
	}
	return a, true
}

// value returns key's value in the bucket at path, resolved as a (nil: absent
// or a nested bucket).
func (v *uview) value(a at, path string, key []byte) []byte {
	for i := len(v.layers); i >= max(a.cut, 1); i-- {
		if u := v.layers[i-1].user[path]; u != nil {
			if e := u.keys[string(key)]; e != nil {
				if e.del {
					return nil
				}
				return e.value
			}
		}
	}
	if a.cut == 0 && a.bb != nil {
		return a.bb.Get(key)
	}
	return nil
}

// entry returns what key is in the bucket at path: its value, or a nested
// bucket (isBucket), or nothing (both zero).
func (v *uview) entry(a at, path string, key []byte) (value []byte, isBucket bool) {
	if val := v.value(a, path, key); val != nil {
		return val, false
	}
	_, isBucket = v.child(a, path == "", joinPath(path, key), key)
	return nil, isBucket
}

// sequence returns the bucket's sequence.
func (v *uview) sequence(a at, path string) uint64 {
	for i := len(v.layers); i >= max(a.cut, 1); i-- {
		if u := v.layers[i-1].user[path]; u != nil && u.hasSeq {
			return u.seqv
		}
	}
	if a.cut == 0 && a.bb != nil {
		return a.bb.Sequence()
	}
	return 0
}

// write applies m to the top layer and hands it to the call's frame.
func (v *uview) write(m mutation) {
	v.layers[len(v.layers)-1].applyUser(0, m)
	v.emit(m)
}

func (v *uview) put(path string, key, value []byte) error {
	a, ok := v.resolve(path)
	switch {
	case !ok:
		return bolterrors.ErrBucketNotFound
	case len(key) == 0:
		return bolterrors.ErrKeyRequired
	case len(key) > bbolt.MaxKeySize:
		return bolterrors.ErrKeyTooLarge
	case int64(len(value)) > bbolt.MaxValueSize:
		return bolterrors.ErrValueTooLarge
	}
	if _, isBucket := v.entry(a, path, key); isBucket {
		return bolterrors.ErrIncompatibleValue
	}
	val := make([]byte, len(value))
	copy(val, value)
	v.write(mutation{op: opUserPut, bucket: []byte(path), key: slices.Clone(key), value: val})
	return nil
}

func (v *uview) del(path string, key []byte) error {
	a, ok := v.resolve(path)
	if !ok {
		return bolterrors.ErrBucketNotFound
	}
	val, isBucket := v.entry(a, path, key)
	switch {
	case isBucket:
		return bolterrors.ErrIncompatibleValue
	case val == nil:
		return nil // absent: nothing to write
	}
	v.write(mutation{op: opUserDelete, bucket: []byte(path), key: slices.Clone(key)})
	return nil
}

// createBucket creates the child name of the bucket at path; ifMissing
// returns an existing one instead of ErrBucketExists.
func (v *uview) createBucket(path string, name []byte, ifMissing bool) error {
	a, ok := v.resolve(path)
	switch {
	case !ok:
		return bolterrors.ErrBucketNotFound
	case len(name) == 0:
		return bolterrors.ErrBucketNameRequired
	}
	val, isBucket := v.entry(a, path, name)
	switch {
	case isBucket && ifMissing:
		return nil
	case isBucket:
		return bolterrors.ErrBucketExists
	case val != nil:
		return bolterrors.ErrIncompatibleValue
	}
	v.write(mutation{op: opCreateBucket, bucket: []byte(path), key: slices.Clone(name)})
	return nil
}

func (v *uview) deleteBucket(path string, name []byte) error {
	a, ok := v.resolve(path)
	if !ok {
		return bolterrors.ErrBucketNotFound
	}
	val, isBucket := v.entry(a, path, name)
	switch {
	case val != nil:
		return bolterrors.ErrIncompatibleValue
	case !isBucket:
		return bolterrors.ErrBucketNotFound
	}
	v.write(mutation{op: opDeleteBucket, bucket: []byte(path), key: slices.Clone(name)})
	return nil
}

func (v *uview) setSequence(path string, seq uint64) error {
	if _, ok := v.resolve(path); !ok {
		return bolterrors.ErrBucketNotFound
	}
	v.write(mutation{op: opSetSequence, bucket: []byte(path), value: binary.BigEndian.AppendUint64(nil, seq)})
	return nil
}

// Moves of a cursor over the bucket at path: each finds the nearest
// candidate key in every source (bbolt's cursor, each layer's names) and
// resolves it through the layers, skipping what they delete, so a cursor
// keeps its place by key whatever the call writes meanwhile.

type move int

const (
	moveFirst  move = iota // the smallest key
	moveLast               // the largest
	moveAfter              // the smallest key > from
	moveBefore             // the largest key < from
	moveSeek               // the smallest key >= from
)

// find returns the key and value a move reaches, or a nil key.
func (v *uview) find(path string, mv move, from []byte) (key, value []byte) {
	a, ok := v.resolve(path)
	if !ok {
		return nil, nil
	}
	var srcs [][]string
	for i := len(v.layers); i >= max(a.cut, 1); i-- {
		if u := v.layers[i-1].user[path]; u != nil {
			if ns := u.names(); len(ns) > 0 {
				srcs = append(srcs, ns)
			}
		}
	}
	var bc *bbolt.Cursor
	if a.cut == 0 && a.bb != nil {
		bc = a.bb.Cursor()
	}
	for {
		k, bv, fromBolt := nearest(srcs, bc, mv, from)
		if k == nil {
			return nil, nil
		}
		if len(srcs) == 0 && fromBolt {
			return k, bv // nothing above bbolt here: its answer stands
		}
		if val, isBucket := v.entry(a, path, k); val != nil || isBucket {
			return k, val
		}
		// Deleted above: go on past it.
		from = k
		switch mv {
		case moveFirst, moveSeek:
			mv = moveAfter
		case moveLast:
			mv = moveBefore
		}
	}
}

// nearest returns the candidate key a move reaches over the sources, and
// bbolt's value when the key came from its cursor alone.
func nearest(srcs [][]string, bc *bbolt.Cursor, mv move, from []byte) (key, bv []byte, fromBolt bool) {
	forward := mv != moveLast && mv != moveBefore
	better := func(k []byte) bool {
		if key == nil {
			return true
		}
		if forward {
			return string(k) < string(key)
		}
		return string(k) > string(key)
	}
	for _, ns := range srcs {
		var i int
		switch mv {
		case moveFirst:
			i = 0
		case moveLast:
			i = len(ns) - 1
		case moveAfter:
			i = sort.SearchStrings(ns, string(from))
			if i < len(ns) && ns[i] == string(from) {
				i++
			}
		case moveSeek:
			i = sort.SearchStrings(ns, string(from))
		case moveBefore:
			i = sort.SearchStrings(ns, string(from)) - 1
		}
		if i >= 0 && i < len(ns) && better([]byte(ns[i])) {
			key, fromBolt = []byte(ns[i]), false
		}
	}
	if bc != nil {
		var k, val []byte
		switch mv {
		case moveFirst:
			k, val = bc.First()
		case moveLast:
			k, val = bc.Last()
		case moveSeek:
			k, val = bc.Seek(from)
		case moveAfter:
			if k, val = bc.Seek(from); k != nil && string(k) == string(from) {
				k, val = bc.Next()
			}
		case moveBefore:
			if k, _ = bc.Seek(from); k == nil {
				k, val = bc.Last()
			} else {
				k, val = bc.Prev()
			}
		}
		if k != nil {
			switch {
			case better(k):
				key, bv, fromBolt = k, val, true
			case string(k) == string(key):
				fromBolt = false // a layer has it too
			}
		}
	}
	return key, bv, fromBolt
}

// Applying DoTx writes to bbolt: in order (a frame too large for a segment,
// committed directly; Open's replay), or as the overlay's state (the
// checkpoint).

// boltBucket returns the bucket at path in tx, or nil.
func boltBucket(tx *bbolt.Tx, path string) *bbolt.Bucket {
	var b *bbolt.Bucket
	for i, nm := range pathNames(path) {
		if i == 0 {
			b = tx.Bucket(nm)
		} else {
			b = b.Bucket(nm)
		}
		if b == nil {
			return nil
		}
	}
	return b
}

// freshBucket deletes the child name of the bucket at parent (a bucket or a
// value), if there, and creates it empty (the state a layer's markFresh stands for).
func freshBucket(tx *bbolt.Tx, parent string, name []byte) error {
	if parent == "" {
		if tx.Bucket(name) != nil {
			if err := tx.DeleteBucket(name); err != nil {
				return err
			}
		}
		_, err := tx.CreateBucket(name)
		return err
	}
	p := boltBucket(tx, parent)
	if p == nil {
		return errMissingParent(parent)
	}
	var err error
	switch {
	case p.Bucket(name) != nil:
		err = p.DeleteBucket(name)
	case p.Get(name) != nil: // a value the layers deleted before
		err = p.Delete(name)
	}
	if err != nil {
		return err
	}
	_, err = p.CreateBucket(name)
	return err
}

// goneBucket deletes the child name of the bucket at parent, if there.
func goneBucket(tx *bbolt.Tx, parent string, name []byte) error {
	if parent == "" {
		if tx.Bucket(name) == nil {
			return nil
		}
		return tx.DeleteBucket(name)
	}
	p := boltBucket(tx, parent)
	if p == nil || p.Bucket(name) == nil {
		return nil
	}
	return p.DeleteBucket(name)
}

// errMissingParent is the error of a DoTx write to a bucket the file
// lacks: the journal and the file disagree.
func errMissingParent(path string) error {
	var names []string
	for _, n := range pathNames(path) {
		names = append(names, string(n))
	}
	return fmt.Errorf("%w: journal: a DoTx write to bucket %q, which the file lacks", ErrCorrupt, strings.Join(names, "/"))
}

// applyUserMutation applies one DoTx write to bbolt, in order.
func applyUserMutation(tx *bbolt.Tx, m mutation) error {
	path := string(m.bucket)
	switch m.op {
	case opCreateBucket:
		return freshBucket(tx, path, m.key)
	case opDeleteBucket:
		return goneBucket(tx, path, m.key)
	}
	b := boltBucket(tx, path)
	if b == nil {
		return errMissingParent(path)
	}
	switch m.op {
	case opUserPut:
		return b.Put(m.key, m.value)
	case opUserDelete:
		return b.Delete(m.key)
	default: // opSetSequence
		return b.SetSequence(binary.BigEndian.Uint64(m.value))
	}
}

// applyUserSnap writes the overlay's DoTx state to bbolt: first the
// buckets' marks, parents first (a bucket created fresh replaces what was
// at its name, a value the layers deleted first), then the keys and
// sequences. A delete of a key that is now a bucket was the delete of the
// value the bucket replaced, done already.
func applyUserSnap(tx *bbolt.Tx, snaps []userSnap) error {
	for _, s := range snaps {
		if s.mark == 0 {
			continue
		}
		parent, name := splitPath(s.path)
		var err error
		if s.mark == markFresh {
			err = freshBucket(tx, parent, []byte(name))
		} else {
			err = goneBucket(tx, parent, []byte(name))
		}
		if err != nil {
			return err
		}
	}
	for _, s := range snaps {
		if s.mark == markGone || (len(s.kvs) == 0 && !s.hasSeq) {
			continue
		}
		b := boltBucket(tx, s.path)
		if b == nil {
			return errMissingParent(s.path)
		}
		for _, e := range s.kvs {
			var err error
			switch {
			case !e.e.del:
				err = b.Put([]byte(e.key), e.e.value)
			case b.Bucket([]byte(e.key)) == nil:
				err = b.Delete([]byte(e.key))
			}
			if err != nil {
				return err
			}
		}
		if s.hasSeq {
			if err := b.SetSequence(s.seqv); err != nil {
				return err
			}
		}
	}
	return nil
}
