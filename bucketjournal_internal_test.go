package idem

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"
)

// Tests written while trying to break DoTx's journaled *Bucket (a helper,
// session 28): errors as bbolt's, sequences under concurrency, cursors over
// mixed layers, delete-then-recreate of a big bucket, and reopen.

// jbops is what one case needs of a bucket, for the engine's and bbolt's.
type jbops interface {
	Put(k, v []byte) error
	Delete(k []byte) error
	Create(name []byte) error
	CreateIfNot(name []byte) error
	DeleteBucket(name []byte) error
	SeekDelete(k []byte) error
	Nested(name []byte) jbops
}

// jbon is jbops on either bucket: the engine's *Bucket (C *Cursor) or
// bbolt's *bbolt.Bucket (C *bbolt.Cursor), which share these methods.
type jbon[B interface {
	comparable
	Put(k, v []byte) error
	Delete(k []byte) error
	CreateBucket(name []byte) (B, error)
	CreateBucketIfNotExists(name []byte) (B, error)
	DeleteBucket(name []byte) error
	Bucket(name []byte) B
	Cursor() C
}, C interface {
	Seek(k []byte) ([]byte, []byte)
	Delete() error
}] struct{ b B }

func (o jbon[B, C]) Put(k, v []byte) error { return o.b.Put(k, v) }
func (o jbon[B, C]) Delete(k []byte) error { return o.b.Delete(k) }
func (o jbon[B, C]) Create(n []byte) error { _, err := o.b.CreateBucket(n); return err }
func (o jbon[B, C]) CreateIfNot(n []byte) error {
	_, err := o.b.CreateBucketIfNotExists(n)
	return err
}
func (o jbon[B, C]) DeleteBucket(n []byte) error { return o.b.DeleteBucket(n) }
func (o jbon[B, C]) SeekDelete(k []byte) error {
	c := o.b.Cursor()
	c.Seek(k)
	return c.Delete()
}
func (o jbon[B, C]) Nested(n []byte) jbops {
	var none B
	if nb := o.b.Bucket(n); nb != none {
		return jbon[B, C]{nb}
	}
	return nil
}

// jbeng and jbbolt are jbops on the engine's bucket and on bbolt's.
type (
	jbeng  = jbon[*Bucket, *Cursor]
	jbbolt = jbon[*bbolt.Bucket, *bbolt.Cursor]
)

// jbsetup: key "k", nested bucket "nb" (with a key), nested "nb2".
func jbsetup(b jbops) error {
	if err := b.Put([]byte("k"), []byte("v")); err != nil {
		return err
	}
	if err := b.Create([]byte("nb")); err != nil {
		return err
	}
	if err := b.Nested([]byte("nb")).Put([]byte("x"), []byte("1")); err != nil {
		return err
	}
	return b.Create([]byte("nb2"))
}

type jbcase struct {
	name string
	run  func(b jbops) error
}

var jbbigValue []byte

func jbcases() []jbcase {
	if jbbigValue == nil {
		// Lazily zeroed by the OS: never touched unless copied.
		jbbigValue = make([]byte, bbolt.MaxValueSize+1)
	}
	return []jbcase{
		{"put empty key", func(b jbops) error { return b.Put([]byte{}, []byte("v")) }},
		{"put nil key", func(b jbops) error { return b.Put(nil, []byte("v")) }},
		{"put max key", func(b jbops) error { return b.Put(make([]byte, bbolt.MaxKeySize), []byte("v")) }},
		{"put key too large", func(b jbops) error { return b.Put(make([]byte, bbolt.MaxKeySize+1), []byte("v")) }},
		{"put value too large", func(b jbops) error { return b.Put([]byte("big"), jbbigValue) }},
		{"put nil value", func(b jbops) error { return b.Put([]byte("nilv"), nil) }},
		{"create existing (earlier)", func(b jbops) error { return b.Create([]byte("nb")) }},
		{"create empty name", func(b jbops) error { return b.Create([]byte{}) }},
		{"create nil name", func(b jbops) error { return b.Create(nil) }},
		{"create name too large", func(b jbops) error { return b.Create(make([]byte, bbolt.MaxKeySize+1)) }},
		{"create-if-not name too large", func(b jbops) error { return b.CreateIfNot(make([]byte, bbolt.MaxKeySize+1)) }},
		{"create on key", func(b jbops) error { return b.Create([]byte("k")) }},
		{"create-if-not on key", func(b jbops) error { return b.CreateIfNot([]byte("k")) }},
		{"create-if-not empty", func(b jbops) error { return b.CreateIfNot(nil) }},
		{"create existing (own)", func(b jbops) error {
			if err := b.Create([]byte("own")); err != nil {
				return err
			}
			return b.Create([]byte("own"))
		}},
		{"put on bucket (earlier)", func(b jbops) error { return b.Put([]byte("nb"), []byte("v")) }},
		{"put on bucket (own)", func(b jbops) error {
			if err := b.Create([]byte("own2")); err != nil {
				return err
			}
			return b.Put([]byte("own2"), []byte("v"))
		}},
		{"create on own key", func(b jbops) error {
			if err := b.Put([]byte("ownk"), []byte("v")); err != nil {
				return err
			}
			return b.Create([]byte("ownk"))
		}},
		{"delete on bucket", func(b jbops) error { return b.Delete([]byte("nb")) }},
		{"delete missing key", func(b jbops) error { return b.Delete([]byte("nope")) }},
		{"delete empty key", func(b jbops) error { return b.Delete(nil) }},
		{"delete bucket missing", func(b jbops) error { return b.DeleteBucket([]byte("nope")) }},
		{"delete bucket on key", func(b jbops) error { return b.DeleteBucket([]byte("k")) }},
		{"delete bucket empty name", func(b jbops) error { return b.DeleteBucket(nil) }},
		{"delete bucket twice", func(b jbops) error {
			if err := b.DeleteBucket([]byte("nb2")); err != nil {
				return err
			}
			return b.DeleteBucket([]byte("nb2"))
		}},
		{"put on deleted bucket name then", func(b jbops) error {
			if err := b.DeleteBucket([]byte("nb")); err != nil {
				return err
			}
			return b.Put([]byte("nb"), []byte("now a key"))
		}},
		{"cursor delete on bucket", func(b jbops) error {
			if err := b.Create([]byte("zz-bucket")); err != nil {
				return err
			}
			return b.SeekDelete([]byte("zz-bucket"))
		}},
	}
}

// TestJournaledBucketErrorsMatchBbolt: each case, in its own fresh bucket written by
// an earlier call, returns what a plain bbolt transaction returns.
func TestJournaledBucketErrorsMatchBbolt(t *testing.T) {
	ctx := context.Background()
	cases := jbcases()

	ref := scratchBolt(t, "ref.db")
	want := make([]error, len(cases))
	require.NoError(t, ref.Update(func(tx *bbolt.Tx) error {
		for i := range cases {
			b, err := tx.CreateBucket(fmt.Appendf(nil, "c%02d", i))
			require.NoError(t, err)
			require.NoError(t, jbsetup(jbbolt{b}))
		}
		return nil
	}))
	require.NoError(t, ref.Update(func(tx *bbolt.Tx) error {
		for i, c := range cases {
			want[i] = c.run(jbbolt{tx.Bucket(fmt.Appendf(nil, "c%02d", i))})
		}
		return nil
	}))

	for _, layer := range []string{"overlay", "bbolt", "own"} {
		t.Run(layer, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "e.db")
			e := openNoCheckpoint(t, path, nil)
			setup := func(_ context.Context, tx *Tx) ([]byte, error) {
				for i := range cases {
					b, err := tx.Bucket(fmt.Appendf(nil, "c%02d", i))
					if err != nil {
						return nil, err
					}
					if err := jbsetup(jbeng{b}); err != nil {
						return nil, err
					}
				}
				return nil, nil
			}
			if layer != "own" {
				_, err := e.DoTx(ctx, "setup", nil, setup)
				require.NoError(t, err)
			}
			if layer == "bbolt" {
				require.NoError(t, e.Close())
				e = openNoCheckpoint(t, path, nil)
			}
			defer e.Close()
			got := make([]error, len(cases))
			_, err := e.DoTx(ctx, "cases", nil, func(c context.Context, tx *Tx) ([]byte, error) {
				if layer == "own" {
					if _, err := setup(c, tx); err != nil {
						return nil, err
					}
				}
				for i, c := range cases {
					b, err := tx.Bucket(fmt.Appendf(nil, "c%02d", i))
					if err != nil {
						return nil, err
					}
					got[i] = c.run(jbeng{b})
				}
				return nil, nil
			})
			require.NoError(t, err)
			for i, c := range cases {
				if want[i] == nil {
					require.NoError(t, got[i], c.name)
				} else {
					require.ErrorIs(t, got[i], want[i], "%s: want %v, got %v", c.name, want[i], got[i])
				}
			}
		})
	}
}

// TestJournaledBucketConcurrentNextSequence: 16 goroutines x 50 DoTx calls each take
// NextSequence of one bucket; every value is unique, and after a reopen the
// next one is above them all.
func TestJournaledBucketConcurrentNextSequence(t *testing.T) {
	ctx := context.Background()
	for _, mode := range []string{"default", "nocheckpoint"} {
		t.Run(mode, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "s.db")
			e := openMode(t, path, mode)
			seqFn := inBucket("seq", func(b *Bucket) ([]byte, error) {
				n, err := b.NextSequence()
				if err != nil {
					return nil, err
				}
				return binary.BigEndian.AppendUint64(nil, n), nil
			})
			const G, N = 16, 50
			var mu sync.Mutex
			var all []uint64
			require.NoError(t, callers(G, N, func(g, i int) error {
				res, err := e.DoTx(ctx, fmt.Sprintf("s-%d-%d", g, i), nil, seqFn)
				if err != nil {
					return err
				}
				mu.Lock()
				all = append(all, binary.BigEndian.Uint64(res.Response))
				mu.Unlock()
				return nil
			}))
			require.Len(t, all, G*N)
			slices.Sort(all)
			for i := 1; i < len(all); i++ {
				require.NotEqual(t, all[i-1], all[i], "duplicate sequence %d", all[i])
			}
			require.Equal(t, uint64(G*N), all[len(all)-1], "sequences are 1..%d", G*N)
			require.NoError(t, e.Close())

			e2, err := Open(path, &Options{PruneInterval: -1})
			require.NoError(t, err)
			defer e2.Close()
			res, err := e2.DoTx(ctx, "after", nil, seqFn)
			require.NoError(t, err)
			require.Greater(t, binary.BigEndian.Uint64(res.Response), all[len(all)-1])
		})
	}
}

// jbwalk returns the keys of b forward, backward, and by Seek of each.
func jbwalk(b *Bucket) (fwd, back []string, seekOK bool) {
	c := b.Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		fwd = append(fwd, string(k))
	}
	for k, _ := c.Last(); k != nil; k, _ = c.Prev() {
		back = append(back, string(k))
	}
	seekOK = true
	for i, k := range fwd {
		if got, _ := c.Seek([]byte(k)); string(got) != k {
			seekOK = false
		}
		// Seek just below k (k minus its last byte plus 0x00 padding is
		// not below it; use the key with its last byte less one, then
		// 0xff): lands on k unless a key sits between.
		low := []byte(k)
		if low[len(low)-1] > 0 {
			low[len(low)-1]--
			low = append(low, 0xff)
			got, _ := c.Seek(low)
			if string(got) != k && (i == 0 || string(got) != fwd[i-1]) {
				seekOK = false
			}
		}
		if i > 0 {
			c.Seek([]byte(k))
			if p, _ := c.Prev(); string(p) != fwd[i-1] {
				seekOK = false
			}
		}
	}
	if k, _ := c.Seek([]byte("\xff\xff")); k != nil {
		seekOK = false
	}
	return fwd, back, seekOK
}

// TestJournaledBucketCursorMixedLayers: keys in bbolt (checkpointed), in the
// overlay (an earlier call, not checkpointed) and the call's own; every move
// gives the sorted set, and Cursor.Delete while iterating visits every key.
func TestJournaledBucketCursorMixedLayers(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "c.db")
	e := openNoCheckpoint(t, path, nil)
	want := map[string]bool{}
	put := func(b *Bucket, k string) error {
		want[k] = true
		return b.Put([]byte(k), []byte("v-"+k))
	}
	del := func(b *Bucket, k string) error {
		delete(want, k)
		return b.Delete([]byte(k))
	}
	_, err := e.DoTx(ctx, "bolt", nil, inBucket("cur", func(b *Bucket) ([]byte, error) {
		for i := 0; i < 40; i += 2 {
			if err := put(b, fmt.Sprintf("k%02d", i)); err != nil {
				return nil, err
			}
		}
		return nil, nil
	}))
	require.NoError(t, err)
	require.NoError(t, e.Close()) // checkpoints: the evens are in bbolt
	e = openNoCheckpoint(t, path, nil)
	defer e.Close()
	_, err = e.DoTx(ctx, "overlay", nil, inBucket("cur", func(b *Bucket) ([]byte, error) {
		for i := 1; i < 40; i += 4 {
			if err := put(b, fmt.Sprintf("k%02d", i)); err != nil {
				return nil, err
			}
		}
		for _, k := range []string{"k00", "k10", "k38"} {
			if err := del(b, k); err != nil {
				return nil, err
			}
		}
		return nil, put(b, "k20") // overwrite
	}))
	require.NoError(t, err)

	sorted := func() []string {
		var ks []string
		for k := range want {
			ks = append(ks, k)
		}
		slices.Sort(ks)
		return ks
	}
	var fwd, back, after []string
	var seekOK bool
	var visited []string
	var delErrs []error
	var wantBefore []string
	_, err = e.DoTx(ctx, "own", nil, inBucket("cur", func(b *Bucket) ([]byte, error) {
		for i := 3; i < 44; i += 4 {
			if err := put(b, fmt.Sprintf("k%02d", i)); err != nil {
				return nil, err
			}
		}
		for _, k := range []string{"k01", "k02", "k39"} {
			if err := del(b, k); err != nil {
				return nil, err
			}
		}
		if err := put(b, "a"); err != nil {
			return nil, err
		}
		if err := put(b, "z"); err != nil {
			return nil, err
		}
		wantBefore = sorted()
		fwd, back, seekOK = jbwalk(b)
		c := b.Cursor()
		for k, _ := c.First(); k != nil; k, _ = c.Next() {
			visited = append(visited, string(k))
			if err := c.Delete(); err != nil {
				delErrs = append(delErrs, err)
			}
		}
		after, _, _ = jbwalk(b)
		return nil, nil
	}))
	require.NoError(t, err)
	require.Equal(t, wantBefore, fwd, "forward")
	rev := slices.Clone(wantBefore)
	slices.Reverse(rev)
	require.Equal(t, rev, back, "backward")
	require.True(t, seekOK, "seek")
	require.Empty(t, delErrs)
	require.Equal(t, wantBefore, visited, "Cursor.Delete while iterating visits every key")
	require.Empty(t, after, "all deleted")

	// A later call, and a reopen, see the bucket empty.
	var later []string
	_, err = e.DoTx(ctx, "later", nil, inBucket("cur", func(b *Bucket) ([]byte, error) {
		later, _, _ = jbwalk(b)
		return nil, nil
	}))
	require.NoError(t, err)
	require.Empty(t, later)
	cp := crashCopy(t, path)
	c, err := Open(cp, &Options{PruneInterval: -1})
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.b.db.View(func(tx *bbolt.Tx) error {
		b := tx.Bucket([]byte("cur"))
		require.NotNil(t, b)
		k, _ := b.Cursor().First()
		require.Nil(t, k, "replayed copy: bucket empty")
		return nil
	}))
}

// TestJournaledBucketRecreateBigBucket: DeleteBucket of a bucket of 1,000 keys (with
// a sequence and a nested bucket), CreateBucket of the same name in the same
// fn: empty, in that fn, in a later call, after a crash and after a reopen.
func TestJournaledBucketRecreateBigBucket(t *testing.T) {
	ctx := context.Background()
	for _, layer := range []string{"overlay", "bbolt", "mixed", "same-call"} {
		t.Run(layer, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "r.db")
			e := openNoCheckpoint(t, path, nil)
			fill := func(from, to int) func(_ context.Context, tx *Tx) ([]byte, error) {
				return inBucket("top", func(top *Bucket) ([]byte, error) {
					big, err := top.CreateBucketIfNotExists([]byte("big"))
					if err != nil {
						return nil, err
					}
					for i := from; i < to; i++ {
						if err := big.Put(fmt.Appendf(nil, "key-%04d", i), []byte("val")); err != nil {
							return nil, err
						}
					}
					inner, err := big.CreateBucketIfNotExists([]byte("inner"))
					if err != nil {
						return nil, err
					}
					if err := inner.Put([]byte("i"), []byte("1")); err != nil {
						return nil, err
					}
					return nil, big.SetSequence(99)
				})
			}
			switch layer {
			case "overlay":
				_, err := e.DoTx(ctx, "fill", nil, fill(0, 1000))
				require.NoError(t, err)
			case "bbolt":
				_, err := e.DoTx(ctx, "fill", nil, fill(0, 1000))
				require.NoError(t, err)
				require.NoError(t, e.Close())
				e = openNoCheckpoint(t, path, nil)
			case "mixed":
				_, err := e.DoTx(ctx, "fill", nil, fill(0, 500))
				require.NoError(t, err)
				require.NoError(t, e.Close())
				e = openNoCheckpoint(t, path, nil)
				_, err = e.DoTx(ctx, "fill2", nil, fill(500, 1000))
				require.NoError(t, err)
			}
			defer func() { _ = e.Close() }()
			check := func(big *Bucket) string {
				if big == nil {
					return "no bucket"
				}
				if k, _ := big.Cursor().First(); k != nil {
					return "first key " + string(k)
				}
				if k, _ := big.Cursor().Last(); k != nil {
					return "last key " + string(k)
				}
				if v := big.Get([]byte("key-0007")); v != nil {
					return "Get key-0007 = " + string(v)
				}
				if big.Bucket([]byte("inner")) != nil {
					return "inner bucket survives"
				}
				if s := big.Sequence(); s != 0 {
					return fmt.Sprint("sequence ", s)
				}
				return ""
			}
			var inFn string
			_, err := e.DoTx(ctx, "recreate", nil, func(c context.Context, tx *Tx) ([]byte, error) {
				if layer == "same-call" {
					if _, err := fill(0, 1000)(c, tx); err != nil {
						return nil, err
					}
				}
				top, err := tx.Bucket([]byte("top"))
				if err != nil {
					return nil, err
				}
				if err := top.DeleteBucket([]byte("big")); err != nil {
					return nil, err
				}
				big, err := top.CreateBucket([]byte("big"))
				if err != nil {
					return nil, err
				}
				inFn = check(big)
				return nil, nil
			})
			require.NoError(t, err)
			require.Empty(t, inFn, "in the same fn")
			var later string
			_, err = e.DoTx(ctx, "later", nil, inBucket("top", func(top *Bucket) ([]byte, error) {
				later = check(top.Bucket([]byte("big")))
				return nil, nil
			}))
			require.NoError(t, err)
			require.Empty(t, later, "in a later call")

			boltCheck := func(db *bbolt.DB) string {
				var s string
				require.NoError(t, db.View(func(tx *bbolt.Tx) error {
					top := tx.Bucket([]byte("top"))
					if top == nil {
						s = "no top"
						return nil
					}
					big := top.Bucket([]byte("big"))
					switch {
					case big == nil:
						s = "no big"
					case big.Stats().KeyN != 0:
						s = fmt.Sprint("keys: ", big.Stats().KeyN)
					case big.Sequence() != 0:
						s = fmt.Sprint("sequence ", big.Sequence())
					default:
						if k, _ := big.Cursor().First(); k != nil {
							s = "first key " + string(k)
						}
					}
					return nil
				}))
				return s
			}
			e = crashedAndReopened(t, e, path, func(db *bbolt.DB, what string) {
				require.Empty(t, boltCheck(db), what)
			})
			var reopened string
			_, err = e.DoTx(ctx, "reopened", nil, inBucket("top", func(top *Bucket) ([]byte, error) {
				reopened = check(top.Bucket([]byte("big")))
				return nil, nil
			}))
			require.NoError(t, err)
			require.Empty(t, reopened, "DoTx after a reopen")
		})
	}
}

// TestJournaledBucketReopenKeepsAcknowledged: every acknowledged concurrent DoTx
// write is there after Close and reopen, and in a crash copy.
func TestJournaledBucketReopenKeepsAcknowledged(t *testing.T) {
	ctx := context.Background()
	for _, mode := range []string{"default", "nocheckpoint"} {
		t.Run(mode, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "a.db")
			e := openMode(t, path, mode)
			const G, N = 8, 40
			var mu sync.Mutex
			acked := map[string]bool{}
			require.NoError(t, callers(G, N, func(g, i int) error {
				k := fmt.Sprintf("w-%02d-%03d", g, i)
				_, err := e.DoTx(ctx, k, nil, inBucket("acks", func(b *Bucket) ([]byte, error) {
					nb, err := b.CreateBucketIfNotExists(fmt.Appendf(nil, "g%02d", g))
					if err != nil {
						return nil, err
					}
					if err := nb.Put([]byte(k), []byte(k)); err != nil {
						return nil, err
					}
					if i > 0 && i%5 == 0 { // overwrite an earlier one
						return nil, nb.Put(fmt.Appendf(nil, "w-%02d-%03d", g, i-1), []byte("over"))
					}
					return nil, nil
				}))
				if err == nil {
					mu.Lock()
					acked[k] = true
					mu.Unlock()
				}
				return nil
			}))
			require.Len(t, acked, G*N)
			wantVal := func(k string) string {
				var g, i int
				_, _ = fmt.Sscanf(k, "w-%02d-%03d", &g, &i)
				if i+1 < N && (i+1)%5 == 0 {
					return "over"
				}
				return k
			}
			verify := func(db *bbolt.DB, what string) {
				require.NoError(t, db.View(func(tx *bbolt.Tx) error {
					b := tx.Bucket([]byte("acks"))
					require.NotNil(t, b, what)
					for k := range acked {
						var g int
						_, _ = fmt.Sscanf(k, "w-%02d-", &g)
						nb := b.Bucket(fmt.Appendf(nil, "g%02d", g))
						require.NotNil(t, nb, what)
						require.Equal(t, wantVal(k), string(nb.Get([]byte(k))), "%s: %s", what, k)
					}
					return nil
				}))
			}
			e2 := crashedAndReopened(t, e, path, verify)
			// and through DoTx
			var missing []string
			_, err := e2.DoTx(ctx, "verify", nil, inBucket("acks", func(b *Bucket) ([]byte, error) {
				for k := range acked {
					var g int
					_, _ = fmt.Sscanf(k, "w-%02d-", &g)
					nb := b.Bucket(fmt.Appendf(nil, "g%02d", g))
					if nb == nil || string(nb.Get([]byte(k))) != wantVal(k) {
						missing = append(missing, k)
					}
				}
				return nil, nil
			}))
			require.NoError(t, err)
			require.Empty(t, missing)
		})
	}
}

var _ = errors.New

// TestJournaledBucketEmptyValue: a key with an empty value is a key, whatever layer
// holds it: Get is non-nil, a cursor shows it, Delete removes it for good.
func TestJournaledBucketEmptyValue(t *testing.T) {
	ctx := context.Background()
	for _, layer := range []string{"own", "overlay", "bbolt", "replayed"} {
		t.Run(layer, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "v.db")
			e := openNoCheckpoint(t, path, nil)
			putFn := inBucket("ev", func(b *Bucket) ([]byte, error) {
				if err := b.Put([]byte("empty"), []byte{}); err != nil {
					return nil, err
				}
				return nil, b.Put([]byte("nilv"), nil)
			})
			if layer != "own" {
				_, err := e.DoTx(ctx, "put", nil, putFn)
				require.NoError(t, err)
			}
			switch layer {
			case "bbolt":
				require.NoError(t, e.Close())
				e = openNoCheckpoint(t, path, nil)
			case "replayed":
				cp := crashCopy(t, path)
				require.NoError(t, e.Close())
				path = cp
				e = openNoCheckpoint(t, path, nil)
			}
			var report []string
			_, err := e.DoTx(ctx, "check", nil, func(c context.Context, tx *Tx) ([]byte, error) {
				if layer == "own" {
					if _, err := putFn(c, tx); err != nil {
						return nil, err
					}
				}
				b, err := tx.Bucket([]byte("ev"))
				if err != nil {
					return nil, err
				}
				for _, k := range []string{"empty", "nilv"} {
					if b.Get([]byte(k)) == nil {
						report = append(report, "Get "+k+" is nil")
					}
				}
				var keys []string
				cur := b.Cursor()
				for k, _ := cur.First(); k != nil; k, _ = cur.Next() {
					keys = append(keys, string(k))
				}
				if !slices.Equal(keys, []string{"empty", "nilv"}) {
					report = append(report, fmt.Sprint("cursor keys ", keys))
				}
				if err := b.Delete([]byte("empty")); err != nil {
					return nil, err
				}
				if _, err := b.CreateBucket([]byte("nilv")); err == nil {
					report = append(report, "CreateBucket over an empty-valued key succeeded")
				}
				return nil, nil
			})
			require.NoError(t, err)
			require.Empty(t, report)
			require.NoError(t, e.Close())
			e2, err := Open(path, &Options{PruneInterval: -1})
			require.NoError(t, err)
			defer e2.Close()
			require.NoError(t, e2.b.db.View(func(tx *bbolt.Tx) error {
				b := tx.Bucket([]byte("ev"))
				require.NotNil(t, b)
				require.Nil(t, b.Get([]byte("empty")), "Delete of the empty-valued key kept")
				require.NotNil(t, b.Get([]byte("nilv")))
				require.Nil(t, b.Bucket([]byte("nilv")))
				return nil
			}))
		})
	}
}

// TestJournaledBucketCursorEndsMatchBbolt: moves past either end, then back, and
// Next/Prev on a fresh cursor, as a plain bbolt cursor answers them.
func TestJournaledBucketCursorEndsMatchBbolt(t *testing.T) {
	ctx := context.Background()
	keys := []string{"a", "b", "c", "d"}
	type mover interface {
		First() ([]byte, []byte)
		Last() ([]byte, []byte)
		Next() ([]byte, []byte)
		Prev() ([]byte, []byte)
		Seek([]byte) ([]byte, []byte)
	}
	type rec = func(k, _ []byte)
	scripts := []struct {
		name string
		run  func(m mover, r rec)
	}{
		{"LastNextPrev", func(m mover, r rec) { r(m.Last()); r(m.Next()); r(m.Prev()) }},
		{"FirstPrevNext", func(m mover, r rec) { r(m.First()); r(m.Prev()); r(m.Next()) }},
		{"SeekPastEndThenPrev", func(m mover, r rec) { r(m.Seek([]byte("zz"))); r(m.Prev()) }},
		{"SeekBetweenThenPrev", func(m mover, r rec) { r(m.Seek([]byte("bb"))); r(m.Prev()) }},
		{"SeekPastEndThenNext", func(m mover, r rec) { r(m.Seek([]byte("zz"))); r(m.Next()) }},
		{"LastNextNextPrev", func(m mover, r rec) { r(m.Last()); r(m.Next()); r(m.Next()); r(m.Prev()) }},
		{"FirstPrevPrevNext", func(m mover, r rec) { r(m.First()); r(m.Prev()); r(m.Prev()); r(m.Next()) }},
		{"SeekBeforeFirstThenPrev", func(m mover, r rec) { r(m.Seek([]byte("0"))); r(m.Prev()); r(m.Next()) }},
		{"FreshNextPrev", func(m mover, r rec) { r(m.Next()); r(m.Prev()) }},
	}
	script := func(c func() mover) [][]string {
		var all [][]string
		for _, sc := range scripts {
			var out []string
			sc.run(c(), func(k, _ []byte) { out = append(out, fmt.Sprintf("%q", k)) })
			all = append(all, out)
		}
		return all
	}
	ref := scratchBolt(t, "ref.db")
	var want [][]string
	require.NoError(t, ref.Update(func(tx *bbolt.Tx) error {
		b, err := tx.CreateBucket([]byte("e"))
		require.NoError(t, err)
		for _, k := range keys {
			require.NoError(t, b.Put([]byte(k), []byte(k)))
		}
		want = script(func() mover { return b.Cursor() })
		return nil
	}))
	e := openNoCheckpoint(t, filepath.Join(t.TempDir(), "e.db"), nil)
	defer e.Close()
	var got [][]string
	_, err := e.DoTx(ctx, "k", nil, inBucket("e", func(b *Bucket) ([]byte, error) {
		for _, k := range keys {
			if err := b.Put([]byte(k), []byte(k)); err != nil {
				return nil, err
			}
		}
		got = script(func() mover { return b.Cursor() })
		return nil, nil
	}))
	require.NoError(t, err)
	for i, sc := range scripts {
		t.Run(sc.name, func(t *testing.T) { require.Equal(t, want[i], got[i]) })
	}
}

// TestJournaledBucketReadModifyWriteAcrossCheckpoints: with checkpoints running at
// once after every kick and a small journal, concurrent calls each
// increment a counter key (Get then Put), add a key and count the keys by
// cursor, and churn a nested bucket (delete, recreate, refill): no update is
// lost, every count is unique, and a reopen agrees.
func TestJournaledBucketReadModifyWriteAcrossCheckpoints(t *testing.T) {
	ctx := context.Background()
	for _, js := range []int{0, 256 << 10} {
		t.Run(fmt.Sprint("journal", js), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "m.db")
			e, err := OpenFile(path, &BoltOptions{JournalSize: js}, &Options{PruneInterval: -1})
			require.NoError(t, err)
			require.NotNil(t, e.b.j, "journal on")
			e.b.j.delay.Store(0)
			fn := func(k string) func(_ context.Context, tx *Tx) ([]byte, error) {
				return inBucket("rmw", func(b *Bucket) ([]byte, error) {
					n, err := bumpCounter(b)
					if err != nil {
						return nil, err
					}
					ks, err := b.CreateBucketIfNotExists([]byte("keys"))
					if err != nil {
						return nil, err
					}
					if err := ks.Put([]byte(k), []byte(k)); err != nil {
						return nil, err
					}
					count := 0
					c := ks.Cursor()
					for kk, _ := c.First(); kk != nil; kk, _ = c.Next() {
						count++
					}
					if b.Bucket([]byte("churn")) != nil {
						if err := b.DeleteBucket([]byte("churn")); err != nil {
							return nil, err
						}
					}
					ch, err := b.CreateBucket([]byte("churn"))
					if err != nil {
						return nil, err
					}
					for i := range 20 {
						if err := ch.Put(fmt.Appendf(nil, "%s-%02d", k, i), []byte("x")); err != nil {
							return nil, err
						}
					}
					return fmt.Appendf(nil, "%d %d", n, count), nil
				})
			}
			const G, N = 16, 40
			var mu sync.Mutex
			counters, counts := map[int]bool{}, map[int]bool{}
			require.NoError(t, callers(G, N, func(g, i int) error {
				k := fmt.Sprintf("m-%02d-%03d", g, i)
				res, err := e.DoTx(ctx, k, nil, fn(k))
				if err != nil {
					return err
				}
				var a, b int
				_, _ = fmt.Sscanf(string(res.Response), "%d %d", &a, &b)
				mu.Lock()
				defer mu.Unlock()
				if counters[a] || counts[b] {
					err = fmt.Errorf("%s: duplicate counter %d or count %d", k, a, b)
				}
				counters[a], counts[b] = true, true
				return err
			}))
			require.Len(t, counters, G*N)
			require.True(t, counters[G*N] && counts[G*N])
			require.NoError(t, e.Close())
			e2, err := Open(path, &Options{PruneInterval: -1})
			require.NoError(t, err)
			defer e2.Close()
			require.NoError(t, e2.b.db.View(func(tx *bbolt.Tx) error {
				b := tx.Bucket([]byte("rmw"))
				require.NotNil(t, b)
				require.Equal(t, uint64(G*N), binary.BigEndian.Uint64(b.Get([]byte("counter"))))
				require.Equal(t, G*N, b.Bucket([]byte("keys")).Stats().KeyN)
				require.Equal(t, 20, b.Bucket([]byte("churn")).Stats().KeyN, "churn holds the last call's 20 keys")
				return nil
			}))
		})
	}
}

// TestJournaledBucketCursorNestedAndWritesWhileIterating: a cursor lists nested
// buckets (nil value) from every layer and skips those deleted above; Puts
// ahead of the cursor during iteration are visited, those behind are not,
// and each Cursor.Delete leaves the walk in place.
func TestJournaledBucketCursorNestedAndWritesWhileIterating(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "n.db")
	e := openNoCheckpoint(t, path, nil)
	_, err := e.DoTx(ctx, "bolt", nil, inBucket("nest", func(b *Bucket) ([]byte, error) {
		for i := range 30 {
			if err := b.Put(fmt.Appendf(nil, "k%02d", i), []byte("v")); err != nil {
				return nil, err
			}
		}
		for _, n := range []string{"b-bolt", "b-bolt-gone", "k05x"} {
			if _, err := b.CreateBucket([]byte(n)); err != nil {
				return nil, err
			}
		}
		return nil, nil
	}))
	require.NoError(t, err)
	require.NoError(t, e.Close())
	e = openNoCheckpoint(t, path, nil)
	defer e.Close()
	_, err = e.DoTx(ctx, "overlay", nil, inBucket("nest", func(b *Bucket) ([]byte, error) {
		if _, err := b.CreateBucket([]byte("b-overlay")); err != nil {
			return nil, err
		}
		return nil, b.DeleteBucket([]byte("b-bolt-gone"))
	}))
	require.NoError(t, err)
	var listed, visited []string
	var nilVals []string
	_, err = e.DoTx(ctx, "walk", nil, inBucket("nest", func(b *Bucket) ([]byte, error) {
		if _, err := b.CreateBucket([]byte("b-own")); err != nil {
			return nil, err
		}
		c := b.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			listed = append(listed, string(k))
			if v == nil {
				nilVals = append(nilVals, string(k))
			}
		}
		c = b.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			visited = append(visited, string(k))
			if v != nil {
				if err := c.Delete(); err != nil {
					return nil, err
				}
			}
			if string(k) == "k10" {
				if err := b.Put([]byte("k10a"), []byte("ahead")); err != nil {
					return nil, err
				}
				if err := b.Put([]byte("k00a"), []byte("behind")); err != nil {
					return nil, err
				}
			}
		}
		return nil, nil
	}))
	require.NoError(t, err)
	buckets := []string{"b-bolt", "b-overlay", "b-own"}
	var keys []string
	for i := range 30 {
		keys = append(keys, fmt.Sprintf("k%02d", i))
	}
	wantListed := append(slices.Clone(buckets), keys...)
	wantListed = append(wantListed, "k05x")
	slices.Sort(wantListed)
	require.Equal(t, wantListed, listed)
	wantNil := append(slices.Clone(buckets), "k05x")
	slices.Sort(wantNil)
	require.Equal(t, wantNil, nilVals)
	wantVisited := append(slices.Clone(wantListed), "k10a")
	slices.Sort(wantVisited)
	require.Equal(t, wantVisited, visited)
}

// TestJournaledBucketFailedCallsLeaveNoTrace: concurrent calls share groups; those
// whose fn fails (an error, or a panic) after writing must leave nothing
// visible to the others or after a reopen: the counter equals the successes.
func TestJournaledBucketFailedCallsLeaveNoTrace(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "f.db")
	e := openNoCheckpoint(t, path, nil)
	errBoom := errors.New("boom")
	fn := func(k string, mode int) func(_ context.Context, tx *Tx) ([]byte, error) {
		return inBucket("fail", func(b *Bucket) ([]byte, error) {
			n, err := bumpCounter(b)
			if err != nil {
				return nil, err
			}
			if _, err := b.NextSequence(); err != nil {
				return nil, err
			}
			if err := b.Put([]byte("key-"+k), []byte("x")); err != nil {
				return nil, err
			}
			if _, err := b.CreateBucketIfNotExists([]byte("bucket-" + k)); err != nil {
				return nil, err
			}
			switch mode {
			case 1:
				return nil, errBoom
			case 2:
				panic("boom")
			}
			return fmt.Appendf(nil, "%d", n), nil
		})
	}
	const G, N = 12, 30
	var mu sync.Mutex
	okKeys := map[string]bool{}
	seen := map[string]bool{}
	require.NoError(t, callers(G, N, func(g, i int) error {
		k := fmt.Sprintf("%02d-%03d", g, i)
		mode := (g + i) % 3
		var res Result
		var err error
		func() {
			defer func() { _ = recover() }()
			res, err = e.DoTx(ctx, k, nil, fn(k, mode))
		}()
		if mode == 0 && err == nil {
			mu.Lock()
			okKeys[k] = true
			seen[string(res.Response)] = true
			mu.Unlock()
		}
		return nil
	}))
	require.NotEmpty(t, okKeys)
	require.Len(t, seen, len(okKeys), "every success saw a distinct counter")
	check := func(db *bbolt.DB, what string) {
		require.NoError(t, db.View(func(tx *bbolt.Tx) error {
			b := tx.Bucket([]byte("fail"))
			require.NotNil(t, b, what)
			require.Equal(t, uint64(len(okKeys)), binary.BigEndian.Uint64(b.Get([]byte("counter"))), "%s: counter", what)
			require.Equal(t, uint64(len(okKeys)), b.Sequence(), "%s: sequence", what)
			c := b.Cursor()
			for k, _ := c.First(); k != nil; k, _ = c.Next() {
				s := string(k)
				if s == "counter" {
					continue
				}
				var id string
				switch {
				case len(s) > 4 && s[:4] == "key-":
					id = s[4:]
				case len(s) > 7 && s[:7] == "bucket-":
					id = s[7:]
				}
				require.True(t, okKeys[id], "%s: %q left by a failed call", what, s)
			}
			return nil
		}))
	}
	crashedAndReopened(t, e, path, check)
}

// TestJournaledBucketBucketAfterFn: a Bucket or Cursor kept past fn reads nothing
// and its writes fail with ErrTxClosed.
func TestJournaledBucketBucketAfterFn(t *testing.T) {
	ctx := context.Background()
	e := openNoCheckpoint(t, filepath.Join(t.TempDir(), "a.db"), nil)
	defer e.Close()
	var kept *Bucket
	var nested *Bucket
	_, err := e.DoTx(ctx, "k", nil, inBucket("after", func(b *Bucket) ([]byte, error) {
		var err error
		if nested, err = b.CreateBucket([]byte("n")); err != nil {
			return nil, err
		}
		kept = b
		return nil, b.Put([]byte("x"), []byte("1"))
	}))
	require.NoError(t, err)
	require.Nil(t, kept.Get([]byte("x")))
	k, _ := kept.Cursor().First()
	require.Nil(t, k)
	require.ErrorIs(t, kept.Put([]byte("y"), []byte("2")), ErrTxClosed)
	require.ErrorIs(t, kept.Delete([]byte("x")), ErrTxClosed)
	_, err = kept.CreateBucket([]byte("m"))
	require.ErrorIs(t, err, ErrTxClosed)
	require.ErrorIs(t, kept.DeleteBucket([]byte("n")), ErrTxClosed)
	require.ErrorIs(t, kept.SetSequence(5), ErrTxClosed)
	_, err = kept.NextSequence()
	require.ErrorIs(t, err, ErrTxClosed)
	require.ErrorIs(t, nested.Put([]byte("y"), []byte("2")), ErrTxClosed)
	require.ErrorIs(t, kept.ForEach(func(_, _ []byte) error { return nil }), ErrTxClosed)
}

// TestJournaledBucketRecreateDeepWithSameNames: a tree top/big/inner/deep with
// keys, in bbolt and the overlay; one fn deletes big and recreates
// big/inner/deep with one fresh key each: none of the old keys, sequences
// or buckets come back, in the fn, a later call, a crash copy or a reopen.
func TestJournaledBucketRecreateDeepWithSameNames(t *testing.T) {
	ctx := context.Background()
	for _, layer := range []string{"overlay", "bbolt"} {
		t.Run(layer, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "d.db")
			e := openNoCheckpoint(t, path, nil)
			_, err := e.DoTx(ctx, "fill", nil, inBucket("top", func(top *Bucket) ([]byte, error) {
				var err error
				b := top
				for _, n := range []string{"big", "inner", "deep"} {
					if b, err = b.CreateBucket([]byte(n)); err != nil {
						return nil, err
					}
					for i := range 300 {
						if err := b.Put(fmt.Appendf(nil, "old-%03d", i), []byte("old")); err != nil {
							return nil, err
						}
					}
					if _, err := b.CreateBucket([]byte("oldkid")); err != nil {
						return nil, err
					}
					if err := b.SetSequence(42); err != nil {
						return nil, err
					}
				}
				return nil, nil
			}))
			require.NoError(t, err)
			if layer == "bbolt" {
				require.NoError(t, e.Close())
				e = openNoCheckpoint(t, path, nil)
			}
			defer func() { _ = e.Close() }()
			// describe lists a subtree as bbolt would: path=key for keys,
			// path/ for buckets, path#seq for non-zero sequences.
			var describe func(b *Bucket, p string, out *[]string)
			describe = func(b *Bucket, p string, out *[]string) {
				if s := b.Sequence(); s != 0 {
					*out = append(*out, fmt.Sprintf("%s#%d", p, s))
				}
				c := b.Cursor()
				for k, v := c.First(); k != nil; k, v = c.Next() {
					if v == nil {
						*out = append(*out, p+"/"+string(k)+"/")
						describe(b.Bucket(k), p+"/"+string(k), out)
					} else {
						*out = append(*out, p+"/"+string(k)+"="+string(v))
					}
				}
			}
			want := []string{"/big/", "/big/fresh=new", "/big/inner/", "/big/inner/deep/", "/big/inner/deep/fresh=new", "/big/inner/fresh=new"}
			var inFn, later []string
			_, err = e.DoTx(ctx, "recreate", nil, inBucket("top", func(top *Bucket) ([]byte, error) {
				if err := top.DeleteBucket([]byte("big")); err != nil {
					return nil, err
				}
				b := top
				for _, n := range []string{"big", "inner", "deep"} {
					if b, err = b.CreateBucket([]byte(n)); err != nil {
						return nil, err
					}
					if err := b.Put([]byte("fresh"), []byte("new")); err != nil {
						return nil, err
					}
				}
				describe(top, "", &inFn)
				return nil, nil
			}))
			require.NoError(t, err)
			require.Equal(t, want, inFn, "in the fn")
			_, err = e.DoTx(ctx, "later", nil, inBucket("top", func(top *Bucket) ([]byte, error) {
				describe(top, "", &later)
				return nil, nil
			}))
			require.NoError(t, err)
			require.Equal(t, want, later, "in a later call")
			reopened := func(p, what string) {
				c, err := Open(p, &Options{PruneInterval: -1})
				require.NoError(t, err)
				defer c.Close()
				var got []string
				_, err = c.DoTx(ctx, "check-"+what, nil, inBucket("top", func(top *Bucket) ([]byte, error) {
					describe(top, "", &got)
					return nil, nil
				}))
				require.NoError(t, err)
				require.Equal(t, want, got, what)
			}
			reopened(crashCopy(t, path), "crash copy")
			require.NoError(t, e.Close())
			reopened(path, "reopen")
		})
	}
}

// inBucket is a DoTx fn that runs fn on the bucket name of its
// transaction (tx.Bucket's error if there is none).
func inBucket(name string, fn func(b *Bucket) ([]byte, error)) func(context.Context, *Tx) ([]byte, error) {
	return func(_ context.Context, tx *Tx) ([]byte, error) {
		b, err := tx.Bucket([]byte(name))
		if err != nil {
			return nil, err
		}
		return fn(b)
	}
}

// crashedAndReopened checks a crash copy of the open engine e's file at
// path (opened, so replayed, then closed) with check, then closes e, opens
// path again and checks it: the engine it returns is closed with the test.
// check is told which of the two it sees ("crash copy", "reopen").
func crashedAndReopened(t *testing.T, e *Engine, path string, check func(db *bbolt.DB, what string)) *Engine {
	t.Helper()
	c, err := Open(crashCopy(t, path), &Options{PruneInterval: -1})
	require.NoError(t, err)
	check(c.b.db, "crash copy")
	require.NoError(t, c.Close())
	require.NoError(t, e.Close())
	e, err = Open(path, &Options{PruneInterval: -1})
	require.NoError(t, err)
	t.Cleanup(func() { e.Close() })
	check(e.b.db, "reopen")
	return e
}

// openMode opens path with the checkpoints running ("default") or held
// back (any other mode: openNoCheckpoint).
func openMode(t *testing.T, path, mode string) *Engine {
	t.Helper()
	if mode != "default" {
		return openNoCheckpoint(t, path, nil)
	}
	e, err := Open(path, &Options{PruneInterval: -1})
	require.NoError(t, err)
	return e
}

// bumpCounter adds one to the big-endian uint64 at b's key "counter" (0
// when absent) and returns the new value: a read-modify-write of one key.
func bumpCounter(b *Bucket) (uint64, error) {
	var n uint64
	if v := b.Get([]byte("counter")); v != nil {
		n = binary.BigEndian.Uint64(v)
	}
	return n + 1, b.Put([]byte("counter"), binary.BigEndian.AppendUint64(nil, n+1))
}

// callers runs call(g, i) for i in [0, n) on each of g goroutines at once,
// and returns the errors of every call, joined (nil if none failed).
func callers(g, n int, call func(g, i int) error) error {
	var wg sync.WaitGroup
	errs := make([]error, g)
	for j := range g {
		wg.Go(func() {
			for i := range n {
				if err := call(j, i); err != nil {
					errs[j] = errors.Join(errs[j], err)
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
