package idem_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit/boltkit"
)

// TestBucketMethods drives every method of the engine's Bucket and Cursor
// inside DoTx fns, and reads the result back in a later call.
func TestBucketMethods(t *testing.T) {
	e, _ := boltkit.Open(t, nil)
	ctx := context.Background()
	_, err := e.DoTx(ctx, "write", nil, func(_ context.Context, tx *idem.Tx) ([]byte, error) {
		b, err := tx.Bucket([]byte("users"))
		if err != nil {
			return nil, err
		}
		for _, k := range []string{"a", "b", "c", "d"} {
			if err := b.Put([]byte(k), []byte("v"+k)); err != nil {
				return nil, err
			}
		}
		if err := b.Delete([]byte("b")); err != nil {
			return nil, err
		}
		if err := b.Delete([]byte("absent")); err != nil {
			return nil, err
		}
		nb, err := b.CreateBucket([]byte("nested"))
		if err != nil {
			return nil, err
		}
		if _, err := b.CreateBucket([]byte("nested")); !errors.Is(err, bolterrors.ErrBucketExists) {
			return nil, errors.New("CreateBucket twice did not refuse")
		}
		if err := nb.Put([]byte("x"), []byte("1")); err != nil {
			return nil, err
		}
		gone, err := b.CreateBucketIfNotExists([]byte("gone"))
		if err != nil {
			return nil, err
		}
		if err := gone.Put([]byte("y"), []byte("2")); err != nil {
			return nil, err
		}
		if err := b.DeleteBucket([]byte("gone")); err != nil {
			return nil, err
		}
		if err := b.SetSequence(41); err != nil {
			return nil, err
		}
		n, err := b.NextSequence()
		if err != nil || n != 42 {
			return nil, errors.Join(err, errors.New("NextSequence after SetSequence(41) is not 42"))
		}
		return nil, nil
	})
	require.NoError(t, err)

	_, err = e.DoTx(ctx, "read", nil, func(_ context.Context, tx *idem.Tx) ([]byte, error) {
		b, err := tx.Bucket([]byte("users"))
		require.NoError(t, err)
		assert.Equal(t, []byte("va"), b.Get([]byte("a")))
		assert.Nil(t, b.Get([]byte("b")), "deleted")
		assert.Nil(t, b.Get([]byte("nested")), "a nested bucket has no value")
		assert.Equal(t, uint64(42), b.Sequence())
		require.NotNil(t, b.Bucket([]byte("nested")))
		assert.Equal(t, []byte("1"), b.Bucket([]byte("nested")).Get([]byte("x")))
		assert.Nil(t, b.Bucket([]byte("gone")))
		assert.ErrorIs(t, b.DeleteBucket([]byte("gone")), bolterrors.ErrBucketNotFound)

		var keys []string
		require.NoError(t, b.ForEach(func(k, _ []byte) error { keys = append(keys, string(k)); return nil }))
		assert.Equal(t, []string{"a", "c", "d", "nested"}, keys)

		c := b.Cursor()
		k, v := c.First()
		assert.Equal(t, "a", string(k))
		assert.Equal(t, "va", string(v))
		k, _ = c.Next()
		assert.Equal(t, "c", string(k))
		k, _ = c.Prev()
		assert.Equal(t, "a", string(k))
		k, v = c.Last()
		assert.Equal(t, "nested", string(k))
		assert.Nil(t, v, "a nested bucket's value is nil")
		k, _ = c.Seek([]byte("b"))
		assert.Equal(t, "c", string(k), "Seek of an absent key lands on the next")
		require.NoError(t, c.Delete())
		k, _ = c.Seek([]byte("d"))
		assert.Equal(t, "d", string(k))
		k, _ = c.Next()
		assert.Equal(t, "nested", string(k))
		k, _ = c.Next()
		assert.Nil(t, k, "past the end")
		return nil, nil
	})
	require.NoError(t, err)

	_, err = e.DoTx(ctx, "reread", nil, func(_ context.Context, tx *idem.Tx) ([]byte, error) {
		b, err := tx.Bucket([]byte("users"))
		require.NoError(t, err)
		assert.Nil(t, b.Get([]byte("c")), "the cursor's delete was committed")
		assert.Equal(t, []byte("vd"), b.Get([]byte("d")))
		return nil, nil
	})
	require.NoError(t, err)
}

// TestBucketAfterFnIsClosed: a Bucket or Cursor kept past fn reads nothing
// and refuses writes with ErrTxClosed, instead of reaching a finished bbolt
// transaction.
func TestBucketAfterFnIsClosed(t *testing.T) {
	e, _ := boltkit.Open(t, nil)
	var kept *idem.Bucket
	var cur *idem.Cursor
	_, err := e.DoTx(context.Background(), "k", nil, func(_ context.Context, tx *idem.Tx) ([]byte, error) {
		b, err := tx.Bucket([]byte("b"))
		if err != nil {
			return nil, err
		}
		kept, cur = b, b.Cursor()
		return nil, b.Put([]byte("k"), []byte("v"))
	})
	require.NoError(t, err)
	assert.Nil(t, kept.Get([]byte("k")))
	assert.ErrorIs(t, kept.Put([]byte("k"), []byte("w")), idem.ErrTxClosed)
	assert.ErrorIs(t, kept.Delete([]byte("k")), idem.ErrTxClosed)
	assert.ErrorIs(t, kept.ForEach(func(_, _ []byte) error { return nil }), idem.ErrTxClosed)
	_, err = kept.CreateBucket([]byte("n"))
	assert.ErrorIs(t, err, idem.ErrTxClosed)
	_, err = kept.CreateBucketIfNotExists([]byte("n"))
	assert.ErrorIs(t, err, idem.ErrTxClosed)
	assert.ErrorIs(t, kept.DeleteBucket([]byte("n")), idem.ErrTxClosed)
	assert.Nil(t, kept.Bucket([]byte("n")))
	assert.ErrorIs(t, kept.SetSequence(3), idem.ErrTxClosed)
	_, err = kept.NextSequence()
	assert.ErrorIs(t, err, idem.ErrTxClosed)
	assert.Zero(t, kept.Sequence())
	k, _ := cur.First()
	assert.Nil(t, k)
	assert.ErrorIs(t, cur.Delete(), idem.ErrTxClosed)
}

// TestBucketWritesOfAFailingFnAreDropped: a permanent error records the
// outcome without fn's bucket writes, nested ones included.
func TestBucketWritesOfAFailingFnAreDropped(t *testing.T) {
	e, _ := boltkit.Open(t, nil)
	ctx := context.Background()
	_, err := e.DoTx(ctx, "fail", nil, func(_ context.Context, tx *idem.Tx) ([]byte, error) {
		b, err := tx.Bucket([]byte("b"))
		if err != nil {
			return nil, err
		}
		nb, err := b.CreateBucket([]byte("n"))
		if err != nil {
			return nil, err
		}
		if err := nb.Put([]byte("k"), []byte("v")); err != nil {
			return nil, err
		}
		if _, err := b.NextSequence(); err != nil {
			return nil, err
		}
		return nil, errors.New("refused")
	})
	require.Error(t, err)
	_, err = e.DoTx(ctx, "read", nil, func(_ context.Context, tx *idem.Tx) ([]byte, error) {
		b, err := tx.Bucket([]byte("b"))
		require.NoError(t, err)
		assert.Nil(t, b.Bucket([]byte("n")))
		assert.Zero(t, b.Sequence())
		return nil, nil
	})
	require.NoError(t, err)
}
