package idem

import (
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"
)

func openPipeline(t *testing.T) (*bbolt.DB, *pipeline) {
	t.Helper()
	db, err := bbolt.Open(filepath.Join(t.TempDir(), "c.db"), 0o600, &bbolt.Options{NoSync: true})
	require.NoError(t, err)
	p := newPipeline(db, nil)
	t.Cleanup(func() {
		p.Stop()
		require.NoError(t, db.Close())
	})
	return db, p
}

func putKey(key string) commitFunc {
	return func(tx *bbolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists([]byte("b"))
		if err != nil {
			return err
		}
		return b.Put([]byte(key), []byte("v"))
	}
}

func pipelineKeys(t *testing.T, db *bbolt.DB) map[string]bool {
	got := map[string]bool{}
	require.NoError(t, db.View(func(tx *bbolt.Tx) error {
		if b := tx.Bucket([]byte("b")); b != nil {
			return b.ForEach(func(k, _ []byte) error { got[string(k)] = true; return nil })
		}
		return nil
	}))
	return got
}

func TestConcurrentCallersShareCommits(t *testing.T) {
	db, p := openPipeline(t)
	const n = 500
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { assert.NoError(t, p.Do(putKey(fmt.Sprint(i)))) })
	}
	wg.Wait()
	require.Len(t, pipelineKeys(t, db), n)
	commits, requests := p.Stats()
	require.EqualValues(t, n, requests)
	require.Less(t, commits, uint64(n), "some commits carried more than one request")
}

func TestFailingAndPanickingFunctionsRollBackAlone(t *testing.T) {
	db, p := openPipeline(t)
	errNo := errors.New("no")
	var wg sync.WaitGroup
	for i := range 300 {
		wg.Go(func() {
			key := fmt.Sprint(i)
			switch i % 3 {
			case 0:
				assert.NoError(t, p.Do(putKey(key)))
			case 1:
				err := p.Do(func(tx *bbolt.Tx) error {
					if err := putKey(key)(tx); err != nil {
						return err
					}
					return errNo
				})
				assert.ErrorIs(t, err, errNo)
			case 2:
				err := p.Do(func(tx *bbolt.Tx) error {
					_ = putKey(key)(tx)
					panic("boom " + key)
				})
				var pe *commitPanic
				if assert.ErrorAs(t, err, &pe) {
					assert.Equal(t, "boom "+key, pe.Value)
					assert.NotEmpty(t, pe.Stack)
				}
			}
		})
	}
	wg.Wait()
	got := pipelineKeys(t, db)
	for i := range 300 {
		require.Equal(t, i%3 == 0, got[fmt.Sprint(i)], "key %d", i)
	}
}

func TestStopDrainsThenRefuses(t *testing.T) {
	db, p := openPipeline(t)
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() { _ = p.Do(putKey(fmt.Sprint(i))) })
	}
	wg.Wait()
	p.Stop()
	p.Stop() // idempotent
	require.ErrorIs(t, p.Do(putKey("late")), errPipelineStopped)
	require.Len(t, pipelineKeys(t, db), 50)
}

func TestStopWaitsForACallersOwnCommit(t *testing.T) {
	_, p := openPipeline(t)
	entered, release := make(chan struct{}), make(chan struct{})
	go func() {
		_ = p.Do(func(tx *bbolt.Tx) error {
			close(entered)
			<-release
			return putKey("lone")(tx)
		})
	}()
	<-entered
	stopped := make(chan struct{})
	go func() { p.Stop(); close(stopped) }()
	close(release)
	<-stopped // would hang if Stop missed the end of the caller's commit
}

func TestGoexitInAFunctionLeavesThePipelineWorking(t *testing.T) {
	for _, name := range []string{"alone", "in a batch"} {
		t.Run(name, func(t *testing.T) {
			db, p := openPipeline(t)
			var wg sync.WaitGroup
			if name == "in a batch" {
				for i := range 20 {
					wg.Go(func() { assert.NoError(t, p.Do(putKey(fmt.Sprint(i)))) })
				}
			}
			exited := make(chan struct{})
			go func() {
				defer close(exited)
				err := p.Do(func(tx *bbolt.Tx) error {
					_ = putKey("goexit")(tx)
					runtime.Goexit() // what t.FailNow does
					return nil
				})
				// Run on the committer goroutine (in a batch), the function
				// ended that goroutine, not this one: Do reports it.
				assert.ErrorIs(t, err, errCommitGoexit)
			}()
			<-exited
			wg.Wait()
			require.NoError(t, p.Do(putKey("after")))
			got := pipelineKeys(t, db)
			require.False(t, got["goexit"], "the exited function's writes are rolled back")
			require.True(t, got["after"])
			if name == "in a batch" {
				require.Len(t, got, 21)
			}
		})
	}
}

func TestHoldingIsTrueOnlyInsideAFunction(t *testing.T) {
	_, p := openPipeline(t)
	require.False(t, p.Holding())
	var inside bool
	require.NoError(t, p.Do(func(*bbolt.Tx) error { inside = p.Holding(); return nil }))
	require.True(t, inside)
	require.False(t, p.Holding())
}
