package idem

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"
)

// DoTx's writes go through the journal (issue 20, step 2): one frame, no
// bbolt commit; the file lacks them until a checkpoint, yet the next DoTx,
// View and a reopen after a crash all see them.
func TestDoTxThroughTheJournal(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "j.db")
	e := openNoCheckpoint(t, path, nil)
	defer e.Close()
	commits, _ := e.b.pipe.Stats()
	groups, _ := e.b.j.stats()
	_, err := e.DoTx(ctx, "order-1", nil, func(_ context.Context, tx *Tx) ([]byte, error) {
		b, err := tx.Bucket([]byte("orders"))
		if err != nil {
			return nil, err
		}
		if err := b.Put([]byte("o-1"), []byte("paid")); err != nil {
			return nil, err
		}
		items, err := b.CreateBucket([]byte("items"))
		if err != nil {
			return nil, err
		}
		if err := items.SetSequence(7); err != nil {
			return nil, err
		}
		if err := items.Put([]byte("i-1"), []byte("1")); err != nil {
			return nil, err
		}
		return []byte("ok"), tx.Enqueue("email", []byte("receipt o-1"))
	})
	require.NoError(t, err)
	c2, _ := e.b.pipe.Stats()
	g2, _ := e.b.j.stats()
	require.Equal(t, groups+1, g2, "the DoTx is one frame of the journal")
	require.Equal(t, commits, c2, "and no bbolt commit")
	require.NoError(t, e.b.db.View(func(tx *bbolt.Tx) error {
		require.Nil(t, tx.Bucket([]byte("orders")), "the file lacks the DoTx's writes until a checkpoint")
		return nil
	}))

	// The next DoTx reads them (from the overlay).
	res, err := e.DoTx(ctx, "order-2", nil, func(_ context.Context, tx *Tx) ([]byte, error) {
		b, err := tx.Bucket([]byte("orders"))
		if err != nil {
			return nil, err
		}
		items := b.Bucket([]byte("items"))
		if items == nil {
			return nil, errors.New("no items bucket")
		}
		n, err := items.NextSequence()
		if err != nil {
			return nil, err
		}
		return fmt.Appendf(nil, "%s %s %d", b.Get([]byte("o-1")), items.Get([]byte("i-1")), n), nil
	})
	require.NoError(t, err)
	require.Equal(t, "paid 1 8", string(res.Response))

	// A crash now: the reopened copy replays them from the journal.
	copyPath := crashCopy(t, path)
	c, err := Open(copyPath, &Options{PruneInterval: -1})
	require.NoError(t, err)
	require.NotZero(t, c.Stats().Replayed)
	checkOrders(t, c)
	var msgs []string
	require.NoError(t, c.Messages(func(m *Message, err error) error {
		require.NoError(t, err)
		msgs = append(msgs, m.Topic+" "+string(m.Payload))
		return nil
	}))
	require.Equal(t, []string{"email receipt o-1"}, msgs)
	require.NoError(t, c.Close())

	// View brings the file up to date first.
	checkOrders(t, e)
}

func checkOrders(t *testing.T, e *Engine) {
	t.Helper()
	require.NoError(t, e.View(func(tx *bbolt.Tx) error {
		b := tx.Bucket([]byte("orders"))
		require.NotNil(t, b)
		require.Equal(t, "paid", string(b.Get([]byte("o-1"))))
		items := b.Bucket([]byte("items"))
		require.NotNil(t, items)
		require.Equal(t, "1", string(items.Get([]byte("i-1"))))
		require.EqualValues(t, 8, items.Sequence())
		return nil
	}))
}

// With the journal on, a DoTx fn that fails is dropped alone: the others of
// its group commit without running again (the commit pipeline, with the
// journal off, runs them again in a new transaction).
func TestDoTxFailingFnDroppedAlone(t *testing.T) {
	ctx := context.Background()
	e := openNoCheckpoint(t, filepath.Join(t.TempDir(), "j.db"), nil)
	defer e.Close()
	const n = 40
	runs := make([]atomic.Int32, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			_, errs[i] = e.DoTx(ctx, fmt.Sprint("k", i), nil, func(_ context.Context, tx *Tx) ([]byte, error) {
				runs[i].Add(1)
				b, err := tx.Bucket([]byte("effects"))
				if err != nil {
					return nil, err
				}
				if err := b.Put(fmt.Append(nil, i), []byte("done")); err != nil {
					return nil, err
				}
				if i%2 == 1 {
					return nil, Retryable(errors.New("try later"))
				}
				return []byte("ok"), nil
			})
		})
	}
	wg.Wait()
	require.NoError(t, e.View(func(tx *bbolt.Tx) error {
		b := tx.Bucket([]byte("effects"))
		for i := range n {
			require.EqualValues(t, 1, runs[i].Load(), "call %d's fn ran once", i)
			if i%2 == 1 {
				require.Error(t, errs[i])
				require.Nil(t, b.Get(fmt.Append(nil, i)), "call %d's writes dropped", i)
			} else {
				require.NoError(t, errs[i])
				require.Equal(t, "done", string(b.Get(fmt.Append(nil, i))), "call %d's writes kept", i)
			}
		}
		return nil
	}))
}

// A fn that calls runtime.Goexit on the journal's writer ends that
// goroutine: its caller gets errCommitGoexit, and the rest of its group runs
// again on another, never more than maxRuns times however many of its group
// exit so.
func TestJournalGoexitBoundsReRuns(t *testing.T) {
	e := openNoCheckpoint(t, filepath.Join(t.TempDir(), "j.db"), nil)
	defer e.Close()
	j := e.b.j
	bucket := timeSlot{Start: 0, End: 1}.Name()
	entered, release := make(chan struct{}), make(chan struct{})
	go func() {
		_ = j.do(func(w *jtx) error { close(entered); <-release; return w.put(bucket, []byte("blocker"), []byte("v")) })
	}()
	<-entered // the writer is busy: what follows queues for one group
	const exits = 6
	var normalRuns atomic.Int32
	errs := make(chan error, exits+1)
	go func() {
		errs <- j.do(func(w *jtx) error { normalRuns.Add(1); return w.put(bucket, []byte("normal"), []byte("v")) })
	}()
	for range exits {
		go func() {
			errs <- j.do(func(*jtx) error { runtime.Goexit(); return nil })
		}()
	}
	for {
		j.wmu.Lock()
		n := len(j.queue)
		j.wmu.Unlock()
		if n == exits+1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	var goexits int
	for range exits + 1 {
		err := <-errs
		switch {
		case errors.Is(err, errCommitGoexit):
			goexits++
		default:
			require.NoError(t, err)
		}
	}
	t.Logf("the normal function ran %d times", normalRuns.Load())
	require.Equal(t, exits, goexits, "each exited caller is told so")
	require.LessOrEqual(t, normalRuns.Load(), int32(maxRuns), "the others' functions ran at most maxRuns times")
	e.b.ov.mu.RLock()
	defer e.b.ov.mu.RUnlock()
	require.NotNil(t, e.b.ov.get(bucket, []byte("normal")), "and their writes are in")
}
