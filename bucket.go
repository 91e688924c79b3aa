package idem

import (
	"go.etcd.io/bbolt"
)

// Bucket is a user bucket inside a DoTx fn's transaction (Tx.Bucket): the
// engine's own type, so that a later version can journal its writes (issue
// 20) without changing the API again. Its methods are bbolt's, with bbolt's
// meaning and errors (go.etcd.io/bbolt/errors: ErrBucketNotFound,
// ErrBucketExists, ErrKeyRequired, ErrIncompatibleValue, ...); a Bucket
// used after fn returned reads nothing and its writes fail with
// ErrTxClosed. The slices its reads return are valid only inside fn: copy
// what you keep.
type Bucket struct {
	t *Tx
	b *bbolt.Bucket
}

// live returns the bbolt bucket, or nil once the transaction is over.
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
	if bb := b.live(); bb != nil {
		return bb.Get(key)
	}
	return nil
}

// Put sets key to value (bbolt's limits: a key of 1 to bbolt.MaxKeySize
// bytes, a value of at most bbolt.MaxValueSize).
func (b *Bucket) Put(key, value []byte) error {
	bb := b.live()
	if bb == nil {
		return b.closed("put")
	}
	return bb.Put(key, value)
}

// Delete removes key; deleting an absent key does nothing.
func (b *Bucket) Delete(key []byte) error {
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
// it is there).
func (b *Bucket) CreateBucket(name []byte) (*Bucket, error) {
	bb := b.live()
	if bb == nil {
		return nil, b.closed("create bucket")
	}
	nb, err := bb.CreateBucket(name)
	if err != nil {
		return nil, err
	}
	return &Bucket{t: b.t, b: nb}, nil
}

// CreateBucketIfNotExists returns the nested bucket name, creating it if
// need be.
func (b *Bucket) CreateBucketIfNotExists(name []byte) (*Bucket, error) {
	bb := b.live()
	if bb == nil {
		return nil, b.closed("create bucket")
	}
	nb, err := bb.CreateBucketIfNotExists(name)
	if err != nil {
		return nil, err
	}
	return &Bucket{t: b.t, b: nb}, nil
}

// DeleteBucket removes the nested bucket name and everything in it
// (bbolt's ErrBucketNotFound if there is none).
func (b *Bucket) DeleteBucket(name []byte) error {
	bb := b.live()
	if bb == nil {
		return b.closed("delete bucket")
	}
	return bb.DeleteBucket(name)
}

// Sequence returns the bucket's sequence number (0 if never set).
func (b *Bucket) Sequence() uint64 {
	if bb := b.live(); bb != nil {
		return bb.Sequence()
	}
	return 0
}

// SetSequence sets the bucket's sequence number.
func (b *Bucket) SetSequence(v uint64) error {
	bb := b.live()
	if bb == nil {
		return b.closed("set sequence")
	}
	return bb.SetSequence(v)
}

// NextSequence increments the bucket's sequence number and returns it.
func (b *Bucket) NextSequence() (uint64, error) {
	bb := b.live()
	if bb == nil {
		return 0, b.closed("next sequence")
	}
	return bb.NextSequence()
}

// Cursor walks a Bucket's keys in order. Its moves return the key and its
// value (nil for a nested bucket), or a nil key past either end; it is
// valid only inside fn, as its Bucket.
type Cursor struct {
	b *Bucket
	c *bbolt.Cursor
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

// First moves to the first key.
func (c *Cursor) First() (key, value []byte) {
	if cc := c.cur(); cc != nil {
		return cc.First()
	}
	return nil, nil
}

// Last moves to the last key.
func (c *Cursor) Last() (key, value []byte) {
	if cc := c.cur(); cc != nil {
		return cc.Last()
	}
	return nil, nil
}

// Next moves to the next key.
func (c *Cursor) Next() (key, value []byte) {
	if cc := c.cur(); cc != nil {
		return cc.Next()
	}
	return nil, nil
}

// Prev moves to the previous key.
func (c *Cursor) Prev() (key, value []byte) {
	if cc := c.cur(); cc != nil {
		return cc.Prev()
	}
	return nil, nil
}

// Seek moves to seek, or to the first key after it if it is absent.
func (c *Cursor) Seek(seek []byte) (key, value []byte) {
	if cc := c.cur(); cc != nil {
		return cc.Seek(seek)
	}
	return nil, nil
}

// Delete removes the key the cursor is on (bbolt's
// ErrIncompatibleValue on a nested bucket).
func (c *Cursor) Delete() error {
	cc := c.cur()
	if cc == nil {
		return c.b.closed("cursor delete")
	}
	return cc.Delete()
}
