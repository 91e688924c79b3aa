package idem

import (
	"go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// Bucket is a user bucket inside a DoTx fn's transaction (Tx.Bucket): the
// engine's own type, whose writes go through the write-ahead journal when it
// is on (issue 20) and straight into bbolt's transaction when it is off
// (BoltOptions.JournalSize negative, NoSync, MaxSize). Either way its methods
// are bbolt's, with bbolt's meaning and errors (go.etcd.io/bbolt/errors:
// ErrBucketNotFound, ErrBucketExists, ErrBucketNameRequired, ErrKeyRequired,
// ErrKeyTooLarge, ErrValueTooLarge, ErrIncompatibleValue), and its reads see
// every acknowledged write, the call's own first. A Bucket used after fn
// returned reads nothing and its writes fail with ErrTxClosed. The slices its
// reads return are valid only inside fn and must not be modified: copy what
// you keep.
type Bucket struct {
	t *Tx
	b *bbolt.Bucket // journal off: bbolt's own bucket
	// path is the bucket's path (pathKey) with the journal on.
	path string
}

// view returns the journal's view of the call, or nil (journal off, or
// the transaction over).
func (b *Bucket) view() *uview {
	if b == nil || b.t == nil {
		return nil
	}
	return b.t.v
}

// live returns the bbolt bucket with the journal off, or nil.
func (b *Bucket) live() *bbolt.Bucket {
	if b == nil || b.t == nil || b.t.tx == nil {
		return nil
	}
	return b.b
}

// closed is the error of a write made after fn returned.
func (b *Bucket) closed(op string) error {
	key := ""
	if b != nil && b.t != nil {
		key = b.t.key
	}
	return &OpError{Op: op, Key: key, Err: ErrTxClosed}
}

// Get returns key's value, or nil if the key is absent or names a nested
// bucket.
func (b *Bucket) Get(key []byte) []byte {
	if v := b.view(); v != nil {
		a, ok := v.resolve(b.path)
		if !ok {
			return nil
		}
		return v.value(a, b.path, key)
	}
	if bb := b.live(); bb != nil {
		return bb.Get(key)
	}
	return nil
}

// Put sets key to value (bbolt's limits: a key of 1 to bbolt.MaxKeySize
// bytes, a value of at most bbolt.MaxValueSize). The bytes are copied.
func (b *Bucket) Put(key, value []byte) error {
	if v := b.view(); v != nil {
		return v.put(b.path, key, value)
	}
	bb := b.live()
	if bb == nil {
		return b.closed("put")
	}
	return bb.Put(key, value)
}

// Delete removes key; deleting an absent key does nothing.
func (b *Bucket) Delete(key []byte) error {
	if v := b.view(); v != nil {
		return v.del(b.path, key)
	}
	bb := b.live()
	if bb == nil {
		return b.closed("delete")
	}
	return bb.Delete(key)
}

// ForEach calls fn for every key of the bucket in key order (v is nil for a
// nested bucket), stopping at fn's first error, which it returns. fn must
// not write to the bucket.
func (b *Bucket) ForEach(fn func(k, v []byte) error) error {
	if b.view() != nil {
		c := b.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if err := fn(k, v); err != nil {
				return err
			}
		}
		return nil
	}
	bb := b.live()
	if bb == nil {
		return b.closed("foreach")
	}
	return bb.ForEach(fn)
}

// Cursor returns a cursor over the bucket's keys, in key order.
func (b *Bucket) Cursor() *Cursor { return &Cursor{b: b} }

// Bucket returns the nested bucket name, or nil if there is none.
func (b *Bucket) Bucket(name []byte) *Bucket {
	if v := b.view(); v != nil {
		a, ok := v.resolve(b.path)
		if !ok {
			return nil
		}
		cpath := joinPath(b.path, name)
		if _, ok := v.child(a, false, cpath, name); !ok || v.value(a, b.path, name) != nil {
			return nil
		}
		return &Bucket{t: b.t, path: cpath}
	}
	bb := b.live()
	if bb == nil {
		return nil
	}
	if nb := bb.Bucket(name); nb != nil {
		return &Bucket{t: b.t, b: nb}
	}
	return nil
}

// CreateBucket creates the nested bucket name (bbolt's ErrBucketExists if
// it is there, ErrIncompatibleValue if name is a key with a value).
func (b *Bucket) CreateBucket(name []byte) (*Bucket, error) {
	return b.create(name, false)
}

// CreateBucketIfNotExists returns the nested bucket name, creating it if
// need be.
func (b *Bucket) CreateBucketIfNotExists(name []byte) (*Bucket, error) {
	return b.create(name, true)
}

func (b *Bucket) create(name []byte, ifMissing bool) (*Bucket, error) {
	if v := b.view(); v != nil {
		if err := v.createBucket(b.path, name, ifMissing); err != nil {
			return nil, err
		}
		return &Bucket{t: b.t, path: joinPath(b.path, name)}, nil
	}
	bb := b.live()
	if bb == nil {
		return nil, b.closed("create bucket")
	}
	create := bb.CreateBucket
	if ifMissing {
		create = bb.CreateBucketIfNotExists
	}
	nb, err := create(name)
	if err != nil {
		return nil, err
	}
	return &Bucket{t: b.t, b: nb}, nil
}

// DeleteBucket removes the nested bucket name and everything in it
// (bbolt's ErrBucketNotFound if there is none).
func (b *Bucket) DeleteBucket(name []byte) error {
	if v := b.view(); v != nil {
		return v.deleteBucket(b.path, name)
	}
	bb := b.live()
	if bb == nil {
		return b.closed("delete bucket")
	}
	return bb.DeleteBucket(name)
}

// Sequence returns the bucket's sequence number (0 if never set).
func (b *Bucket) Sequence() uint64 {
	if v := b.view(); v != nil {
		a, ok := v.resolve(b.path)
		if !ok {
			return 0
		}
		return v.sequence(a, b.path)
	}
	if bb := b.live(); bb != nil {
		return bb.Sequence()
	}
	return 0
}

// SetSequence sets the bucket's sequence number.
func (b *Bucket) SetSequence(seq uint64) error {
	if v := b.view(); v != nil {
		return v.setSequence(b.path, seq)
	}
	bb := b.live()
	if bb == nil {
		return b.closed("set sequence")
	}
	return bb.SetSequence(seq)
}

// NextSequence increments the bucket's sequence number and returns it.
func (b *Bucket) NextSequence() (uint64, error) {
	if v := b.view(); v != nil {
		a, ok := v.resolve(b.path)
		if !ok {
			return 0, bolterrors.ErrBucketNotFound
		}
		seq := v.sequence(a, b.path) + 1
		return seq, v.setSequence(b.path, seq)
	}
	bb := b.live()
	if bb == nil {
		return 0, b.closed("next sequence")
	}
	return bb.NextSequence()
}

// Cursor walks a Bucket's keys in order. Its moves return the key and its
// value (nil for a nested bucket), or a nil key past either end; it is
// valid only inside fn, as its Bucket. As bbolt's, a Seek past the last
// key leaves it after the last (Prev then finds the last key), and a Next
// or Prev that finds nothing leaves it where it was. With the journal on it keeps its
// place by key: writes made meanwhile (Put, Delete, the cursor's own
// Delete) never make it skip or repeat a key.
type Cursor struct {
	b   *Bucket
	c   *bbolt.Cursor
	key []byte // journal on: where the cursor is (nil: nowhere)
	end bool   // journal on: past the last key, where a Seek that found none leaves it
}

// cur returns the bbolt cursor, made on first use, or nil once the
// transaction is over.
func (c *Cursor) cur() *bbolt.Cursor {
	bb := c.b.live()
	if bb == nil {
		return nil
	}
	if c.c == nil {
		c.c = bb.Cursor()
	}
	return c.c
}

// to makes a move with the journal on.
func (c *Cursor) to(v *uview, mv move, from []byte) (key, value []byte) {
	key, value = v.find(c.b.path, mv, from)
	if key != nil {
		c.key, c.end = key, false
	} else if mv != moveAfter && mv != moveBefore {
		// As bbolt's: a Seek past every key leaves the cursor after the
		// last (Prev finds it); First and Last of an empty bucket nowhere.
		c.key, c.end = nil, mv == moveSeek
	}
	return key, value
}

// First moves to the first key.
func (c *Cursor) First() (key, value []byte) {
	if v := c.b.view(); v != nil {
		return c.to(v, moveFirst, nil)
	}
	if cc := c.cur(); cc != nil {
		return cc.First()
	}
	return nil, nil
}

// Last moves to the last key.
func (c *Cursor) Last() (key, value []byte) {
	if v := c.b.view(); v != nil {
		return c.to(v, moveLast, nil)
	}
	if cc := c.cur(); cc != nil {
		return cc.Last()
	}
	return nil, nil
}

// Next moves to the next key.
func (c *Cursor) Next() (key, value []byte) {
	if v := c.b.view(); v != nil {
		if c.key == nil {
			return nil, nil
		}
		return c.to(v, moveAfter, c.key)
	}
	if cc := c.cur(); cc != nil {
		return cc.Next()
	}
	return nil, nil
}

// Prev moves to the previous key.
func (c *Cursor) Prev() (key, value []byte) {
	if v := c.b.view(); v != nil {
		if c.end {
			return c.to(v, moveLast, nil)
		}
		if c.key == nil {
			return nil, nil
		}
		return c.to(v, moveBefore, c.key)
	}
	if cc := c.cur(); cc != nil {
		return cc.Prev()
	}
	return nil, nil
}

// Seek moves to seek, or to the first key after it if it is absent.
func (c *Cursor) Seek(seek []byte) (key, value []byte) {
	if v := c.b.view(); v != nil {
		return c.to(v, moveSeek, seek)
	}
	if cc := c.cur(); cc != nil {
		return cc.Seek(seek)
	}
	return nil, nil
}

// Delete removes the key the cursor is on (bbolt's
// ErrIncompatibleValue on a nested bucket).
func (c *Cursor) Delete() error {
	if v := c.b.view(); v != nil {
		if c.key == nil {
			return nil
		}
		return v.del(c.b.path, c.key)
	}
	cc := c.cur()
	if cc == nil {
		return c.b.closed("cursor delete")
	}
	return cc.Delete()
}
