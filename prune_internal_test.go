package idem

import (
	"context"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/idemkit/idem/idemcore"
)

// commitCounter counts the engine's commits (EventCommit).
type commitCounter struct{ n atomic.Int64 }

func (c *commitCounter) Observe(ev Event) {
	if ev.Kind == EventCommit {
		c.n.Add(1)
	}
}

// TestBoltPruneHonoursTheRequest: the slot pruner, the bbolt backend's
// Prune, judges by the idemcore.PruneRequest it gets, never by the engine's
// options: the request's Now and Retention decide what expired, KeepStarted
// keeps interrupted executions (and Interrupted counts those it deleted), and
// Limit bounds the records deleted per commit.
func TestBoltPruneHonoursTheRequest(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	clock := &jumpClock{now: t0}
	var commits commitCounter
	e, err := OpenFile(filepath.Join(t.TempDir(), "idem.db"), &BoltOptions{NoSync: true}, &Options{Now: clock.Now, PruneInterval: -1,
		Retention: time.Hour, Observer: &commits})
	require.NoError(t, err)
	defer e.Close()
	b := e.b
	ctx := context.Background()
	// Three done records and one interrupted execution, in one slot.
	require.NoError(t, b.write(func(tx *bbolt.Tx) error {
		for i := range 3 {
			r := &Record{Key: fmt.Sprintf("done-%d", i), State: StateDone, Attempt: 1, StartedAt: t0, CompletedAt: t0}
			if err := b.st.put(boltRec{tx}, r, nil); err != nil {
				return err
			}
		}
		return b.st.put(boltRec{tx}, &Record{Key: "started", State: StateStarted, Attempt: 1, StartedAt: t0}, nil)
	}))
	prune := func(req idemcore.PruneRequest) idemcore.PruneResult {
		t.Helper()
		res, err := b.Prune(ctx, req)
		require.NoError(t, err)
		return res
	}
	late := t0.Add(3 * time.Hour) // past the engine's window and a slot width
	require.Zero(t, prune(idemcore.PruneRequest{Now: t0.Add(30 * time.Minute), Retention: time.Hour, Limit: 10}),
		"inside the window at the request's Now, whatever the engine's clock")
	require.Zero(t, prune(idemcore.PruneRequest{Now: late, Retention: 10 * time.Hour, Limit: 10}),
		"the request's longer retention keeps them")

	before := commits.n.Load()
	require.Equal(t, idemcore.PruneResult{Deleted: 3}, prune(idemcore.PruneRequest{Now: late, Retention: time.Hour, KeepStarted: true, Limit: 1}),
		"KeepStarted keeps the interrupted execution; the done records go")
	require.Equal(t, int64(3), commits.n.Load()-before, "Limit 1: one record per commit")
	_, err = e.Get("started")
	require.NoError(t, err, "the interrupted execution is still there")

	require.Equal(t, idemcore.PruneResult{Deleted: 1, Interrupted: 1}, prune(idemcore.PruneRequest{Now: late, Retention: time.Hour, Limit: 10}))
	st, err := e.ScanFile()
	require.NoError(t, err)
	require.Zero(t, st.Started+st.Done+st.ExpiredPending)
}

// TestBoltClaimDueQuarantines: a pending message that fails to decode is
// never claimed; ClaimDue moves it, byte for byte, to the dead letters and
// reports its Seq in Due.Quarantined, once, and it holds back nothing.
func TestBoltClaimDueQuarantines(t *testing.T) {
	e, err := OpenFile(filepath.Join(t.TempDir(), "idem.db"), &BoltOptions{NoSync: true}, &Options{PruneInterval: -1})
	require.NoError(t, err)
	defer e.Close()
	ctx := context.Background()
	for range 2 {
		_, err := e.DoTx(ctx, "k-"+fmt.Sprint(e.c.Now().UnixNano()), nil, func(_ context.Context, tx *Tx) ([]byte, error) {
			return nil, tx.EnqueueOrdered("t", "one key", nil)
		})
		require.NoError(t, err)
	}
	garbage := []byte("not a message")
	require.NoError(t, e.b.write(func(tx *bbolt.Tx) error { return outboxBucket(tx).Put(u64Key(1), garbage) }))
	due, err := e.b.ClaimDue(ctx, e.c.Now(), 10)
	require.NoError(t, err)
	require.Equal(t, []uint64{1}, due.Quarantined)
	require.Len(t, due.Messages, 1)
	require.Equal(t, uint64(2), due.Messages[0].Seq, "the next message of its ordering key is not held back")
	require.NoError(t, e.View(func(tx *bbolt.Tx) error {
		require.Nil(t, outboxBucket(tx).Get(u64Key(1)))
		require.Equal(t, garbage, deadBucket(tx).Get(u64Key(1)))
		return nil
	}))
	due, err = e.b.ClaimDue(ctx, e.c.Now(), 10)
	require.NoError(t, err)
	require.Empty(t, due.Quarantined, "reported once")
	require.Empty(t, due.Messages, "seq 2 is claimed")
}
