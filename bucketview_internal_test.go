package idem

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"
)

// TestBucketViewMatchesBbolt: a DoTx fn's view of its buckets over the
// journal's layers (bucketview.go) answers every call as bbolt's own
// transaction does, whatever layer each earlier write sits in. Random
// operations (nested buckets, keys that are also bucket names, sequences,
// cursors with Delete) run at once on one bbolt write transaction (the
// reference) and on the view, whose writes are moved down as they age:
// into bbolt (a checkpoint, applyUserSnap), into the overlay (a frame,
// overlay.apply), into the group's pending writes, or kept as the call's
// own. Every answer, every error and, at the end, the whole tree must be
// the same; so must the file the ordered apply (replay, applyOrdered) and
// the checkpoint make.
func TestBucketViewMatchesBbolt(t *testing.T) {
	for seed := range uint64(60) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { checkBucketView(t, seed) })
	}
}

func scratchBolt(t *testing.T, name string) *bbolt.DB {
	db, err := bbolt.Open(filepath.Join(t.TempDir(), name), 0o600, &bbolt.Options{NoSync: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// viewRig is the view under test: a bbolt file (what checkpoints wrote) and
// three layers, with every mutation made so far in order.
type viewRig struct {
	t      *testing.T
	db     *bbolt.DB
	rtx    *bbolt.Tx
	ov     *overlay
	pend   *overlay
	own    *overlay
	seq    uint64
	muts   []mutation // every write, in order
	ownAt  int        // muts[ownAt:] are own's, muts[pendAt:ownAt] pend's
	pendAt int
}

func (r *viewRig) view() *uview {
	return &uview{tx: r.rtx, layers: []*overlay{r.ov, r.pend, r.own},
		emit: func(m mutation) { r.muts = append(r.muts, m) }}
}

// age moves writes down a layer: own's to pend, pend's into a frame of
// the overlay, or the overlay's into bbolt (a checkpoint).
func (r *viewRig) age(rng *rand.Rand) {
	switch rng.IntN(3) {
	case 0: // the call ends: its writes join the group's
		r.pend.apply(0, r.muts[r.ownAt:])
		r.own, r.ownAt = newOverlay(), len(r.muts)
	case 1: // the group's frame is durable
		r.pend.apply(0, r.muts[r.ownAt:])
		r.seq++
		r.ov.apply(r.seq, r.muts[r.pendAt:])
		r.pend, r.own = newOverlay(), newOverlay()
		r.pendAt, r.ownAt = len(r.muts), len(r.muts)
	case 2: // a checkpoint covers the overlay
		require.NoError(r.t, r.rtx.Rollback())
		snap := r.ov.snapshotUser()
		require.NoError(r.t, r.db.Update(func(tx *bbolt.Tx) error { return applyUserSnap(tx, snap) }))
		r.ov.dropUser(r.seq)
		require.Zero(r.t, r.ov.usern.Load(), "the checkpoint covered the overlay")
		require.Empty(r.t, r.ov.user)
		var err error
		r.rtx, err = r.db.Begin(false)
		require.NoError(r.t, err)
	}
}

var (
	viewNames = []string{"a", "b", "k1"}
	viewKeys  = []string{"a", "b", "k1", "k2", "k3"}
)

func checkBucketView(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 7))
	ref := scratchBolt(t, "ref.db")
	rtx, err := ref.Begin(true)
	require.NoError(t, err)
	defer func() { _ = rtx.Rollback() }()

	r := &viewRig{t: t, db: scratchBolt(t, "view.db"), ov: newOverlay(), pend: newOverlay(), own: newOverlay()}
	r.rtx, err = r.db.Begin(false)
	require.NoError(t, err)
	defer func() { _ = r.rtx.Rollback() }()
	tx := &Tx{b: nil, key: "k"}
	tx.v = r.view()

	// paths known to exist in the reference (the top level's buckets and
	// nested ones), as name lists.
	existing := func() [][]string {
		var out [][]string
		var walk func(b *bbolt.Bucket, at []string)
		walk = func(b *bbolt.Bucket, at []string) {
			out = append(out, at)
			_ = b.ForEachBucket(func(k []byte) error {
				walk(b.Bucket(k), append(slices.Clone(at), string(k)))
				return nil
			})
		}
		_ = rtx.ForEach(func(name []byte, b *bbolt.Bucket) error { walk(b, []string{string(name)}); return nil })
		return out
	}
	refBucket := func(p []string) *bbolt.Bucket {
		b := rtx.Bucket([]byte(p[0]))
		for _, n := range p[1:] {
			b = b.Bucket([]byte(n))
		}
		return b
	}
	viewBucket := func(p []string) *Bucket {
		names := make([][]byte, len(p))
		for i, n := range p {
			names[i] = []byte(n)
		}
		return &Bucket{t: tx, path: pathKey(names...)}
	}
	same := func(what string, want, got any) {
		t.Helper()
		require.Equal(t, want, got, "seed %d: %s", seed, what)
	}
	sameErr := func(what string, want, got error) {
		t.Helper()
		require.True(t, errors.Is(got, want) || (want == nil && got == nil), "seed %d: %s: bbolt says %v, the view %v", seed, what, want, got)
	}
	pick := func(s []string) []byte { return []byte(s[rng.IntN(len(s))]) }

	var cur struct {
		path []string
		rc   *bbolt.Cursor
		vc   *Cursor
	}
	for step := range 400 {
		tx.v = r.view()
		if step%7 == 6 {
			r.age(rng)
			tx.v = r.view()
		}
		paths := existing()
		if len(paths) == 0 || rng.IntN(12) == 0 {
			name := pick(viewNames)
			_, rerr := rtx.CreateBucketIfNotExists(name)
			_, verr := tx.Bucket(name)
			sameErr("Tx.Bucket", rerr, errors.Unwrap(verr))
			continue
		}
		p := paths[rng.IntN(len(paths))]
		rb, vb := refBucket(p), viewBucket(p)
		what := fmt.Sprintf("step %d on %s", step, strings.Join(p, "/"))
		k := pick(viewKeys)
		switch op := rng.IntN(14); op {
		case 0:
			same(what+": Get "+string(k), rb.Get(k), vb.Get(k))
		case 1, 2:
			v := []byte(fmt.Sprint(rng.IntN(100)))
			sameErr(what+": Put "+string(k), rb.Put(k, v), vb.Put(k, v))
		case 3:
			sameErr(what+": Delete "+string(k), rb.Delete(k), vb.Delete(k))
		case 4:
			_, rerr := rb.CreateBucket(k)
			_, verr := vb.CreateBucket(k)
			sameErr(what+": CreateBucket "+string(k), rerr, verr)
		case 5:
			_, rerr := rb.CreateBucketIfNotExists(k)
			_, verr := vb.CreateBucketIfNotExists(k)
			sameErr(what+": CreateBucketIfNotExists "+string(k), rerr, verr)
		case 6:
			if rng.IntN(3) == 0 {
				sameErr(what+": DeleteBucket "+string(k), rb.DeleteBucket(k), vb.DeleteBucket(k))
			}
		case 7:
			same(what+": Bucket "+string(k)+" exists", rb.Bucket(k) != nil, vb.Bucket(k) != nil)
			same(what+": Sequence", rb.Sequence(), vb.Sequence())
		case 8:
			rs, rerr := rb.NextSequence()
			vs, verr := vb.NextSequence()
			sameErr(what+": NextSequence", rerr, verr)
			same(what+": NextSequence", rs, vs)
		case 9:
			s := uint64(rng.IntN(50))
			sameErr(what+": SetSequence", rb.SetSequence(s), vb.SetSequence(s))
		case 10: // a whole walk
			var want, got []string
			require.NoError(t, rb.ForEach(func(k, v []byte) error { want = append(want, fmt.Sprintf("%s=%q", k, v)); return nil }))
			require.NoError(t, vb.ForEach(func(k, v []byte) error { got = append(got, fmt.Sprintf("%s=%q", k, v)); return nil }))
			same(what+": ForEach", want, got)
		case 11, 12, 13: // cursor moves; a fresh cursor when the bucket changes
			if !slices.Equal(cur.path, p) || cur.rc == nil || op == 13 {
				cur.path, cur.rc, cur.vc = p, rb.Cursor(), vb.Cursor()
				rk, rv := cur.rc.First()
				vk, vv := cur.vc.First()
				same(what+": First", [2][]byte{rk, rv}, [2][]byte{vk, vv})
				continue
			}
			var rk, rv, vk, vv []byte
			name := ""
			switch rng.IntN(6) {
			case 0:
				name = "Last"
				rk, rv = cur.rc.Last()
				vk, vv = cur.vc.Last()
			case 1:
				name = "Seek " + string(k)
				rk, rv = cur.rc.Seek(k)
				vk, vv = cur.vc.Seek(k)
			case 2, 3:
				name = "Next"
				rk, rv = cur.rc.Next()
				vk, vv = cur.vc.Next()
			case 4:
				name = "Prev"
				rk, rv = cur.rc.Prev()
				vk, vv = cur.vc.Prev()
			case 5:
				// Delete where the cursor is, then Next: on a key (not a
				// bucket, not past an end).
				rk, _ = cur.rc.Seek(k)
				vk, _ = cur.vc.Seek(k)
				same(what+": Seek before Delete", rk, vk)
				if rk == nil || rb.Bucket(rk) != nil {
					continue
				}
				sameErr(what+": Cursor.Delete "+string(rk), cur.rc.Delete(), cur.vc.Delete())
				// The view's Next goes on to the key after the deleted
				// one; bbolt's skips one (etcd-io/bbolt#146), so the
				// reference is a Seek past the deleted key.
				name = "Next after Delete"
				rk, rv = cur.rc.Seek(rk)
				vk, vv = cur.vc.Next()
			}
			same(what+": "+name, [2][]byte{rk, rv}, [2][]byte{vk, vv})
			if rk == nil {
				cur.rc = nil // past an end: bbolt's next move is its own affair
			}
			continue
		}
		cur.rc = nil // a write: bbolt's cursors must be positioned again
	}

	// The whole tree, through the view and in the reference.
	tx.v = r.view()
	same("the tree", dumpBolt(rtx), dumpView(t, tx))

	// The file the ordered apply makes from every write (replay) is the
	// reference's; so is the one the checkpoint makes from the layers.
	replayed := scratchBolt(t, "replay.db")
	require.NoError(t, replayed.Update(func(tx *bbolt.Tx) error {
		for _, m := range r.muts {
			if err := applyOrdered(tx, m); err != nil {
				return err
			}
		}
		return nil
	}))
	var got string
	require.NoError(t, replayed.View(func(tx *bbolt.Tx) error { got = dumpBolt(tx); return nil }))
	same("the file replay makes", dumpBolt(rtx), got)

	r.pend.apply(0, r.muts[r.ownAt:])
	r.seq++
	r.ov.apply(r.seq, r.muts[r.pendAt:])
	require.NoError(t, r.rtx.Rollback())
	snap := r.ov.snapshotUser()
	require.NoError(t, r.db.Update(func(tx *bbolt.Tx) error { return applyUserSnap(tx, snap) }))
	require.NoError(t, r.db.View(func(tx *bbolt.Tx) error { got = dumpBolt(tx); return nil }))
	same("the file the checkpoint makes", dumpBolt(rtx), got)
	r.rtx, err = r.db.Begin(false)
	require.NoError(t, err)
}

// dumpBolt prints every bucket, key, value and sequence of tx.
func dumpBolt(tx *bbolt.Tx) string {
	var b strings.Builder
	var walk func(bk *bbolt.Bucket, at string)
	walk = func(bk *bbolt.Bucket, at string) {
		fmt.Fprintf(&b, "%s seq=%d\n", at, bk.Sequence())
		_ = bk.ForEach(func(k, v []byte) error {
			if v == nil {
				walk(bk.Bucket(k), at+"/"+string(k))
			} else {
				fmt.Fprintf(&b, "%s/%s=%q\n", at, k, v)
			}
			return nil
		})
	}
	_ = tx.ForEach(func(name []byte, bk *bbolt.Bucket) error { walk(bk, string(name)); return nil })
	return b.String()
}

// dumpView prints the view's tree as dumpBolt prints bbolt's.
func dumpView(t *testing.T, tx *Tx) string {
	var b strings.Builder
	var walk func(bk *Bucket, at string)
	walk = func(bk *Bucket, at string) {
		fmt.Fprintf(&b, "%s seq=%d\n", at, bk.Sequence())
		require.NoError(t, bk.ForEach(func(k, v []byte) error {
			if v == nil {
				walk(bk.Bucket(k), at+"/"+string(k))
			} else {
				fmt.Fprintf(&b, "%s/%s=%q\n", at, k, v)
			}
			return nil
		}))
	}
	// The top level: the names any layer or bbolt has.
	var top []string
	for _, n := range viewNames {
		if _, ok := tx.v.resolve(pathKey([]byte(n))); ok {
			top = append(top, n)
		}
	}
	for _, n := range top {
		walk(&Bucket{t: tx, path: pathKey([]byte(n))}, n)
	}
	return b.String()
}
