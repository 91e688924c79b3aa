package idem

import (
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"
)

// queueFull returns once n requests wait in p's queue.
func queueFull(p *pipeline, n int) {
	for {
		p.mu.Lock()
		queued := len(p.queue)
		p.mu.Unlock()
		if queued >= n {
			return
		}
		runtime.Gosched()
	}
}

// No function runs more than maxRuns times, whatever fails around it: a
// batch of n requests, queued behind a commit that holds the writer so they
// share the next transactions, where fails decides (from the request's index
// and its run, and the failures so far) which runs fail.
func TestReRunsAreBounded(t *testing.T) {
	const n = 200
	cases := map[string]func(i, run int, failures int64) bool{
		// 20 requests fail whatever the transaction holds.
		"20 permanent failures": func(i, _ int, _ int64) bool { return i%10 == 9 },
		// Each re-run exposes a new failure: the request at n-1-f fails once
		// f others have failed, so the earliest requests would run n times.
		"each re-run exposes a new failure": func(i, _ int, failures int64) bool { return int64(n-1-i) == failures },
		// Every request fails on its second run, after a first failure.
		"every second run fails": func(i, run int, _ int64) bool { return i == n-1 || run == 2 },
		// Every request fails on its third run.
		"every third run fails": func(i, run int, _ int64) bool { return i == n-1 || run == 3 },
	}
	for name, fails := range cases {
		t.Run(name, func(t *testing.T) {
			db, err := bbolt.Open(filepath.Join(t.TempDir(), "c.db"), 0o600, &bbolt.Options{NoSync: true})
			require.NoError(t, err)
			p := newPipeline(db, nil)
			defer func() {
				p.Stop()
				require.NoError(t, db.Close())
			}()

			release := make(chan struct{})
			blocker := make(chan error, 1)
			holding := make(chan struct{})
			go func() {
				blocker <- p.Do(func(*bbolt.Tx) error { close(holding); <-release; return nil })
			}()
			<-holding

			var failures atomic.Int64
			runs := make([]atomic.Int64, n)
			errs := make([]error, n)
			errFail := errors.New("fn failed")
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					errs[i] = p.Do(func(tx *bbolt.Tx) error {
						run := int(runs[i].Add(1))
						b, err := tx.CreateBucketIfNotExists([]byte("b"))
						if err != nil {
							return err
						}
						if err := b.Put(fmt.Append(nil, i), []byte("v")); err != nil {
							return err
						}
						if fails(i, run, failures.Load()) {
							failures.Add(1)
							return errFail
						}
						return nil
					})
				})
				queueFull(p, i+1) // queued in index order
			}
			close(release)
			wg.Wait()
			require.NoError(t, <-blocker)

			total := 0
			for i := range n {
				r := int(runs[i].Load())
				total += r
				require.LessOrEqual(t, r, maxRuns, "request %d ran %d times", i, r)
				require.GreaterOrEqual(t, r, 1)
				if errs[i] != nil {
					require.ErrorIs(t, errs[i], errFail)
				}
			}
			require.NoError(t, db.View(func(tx *bbolt.Tx) error {
				b := tx.Bucket([]byte("b"))
				for i := range n {
					committed := b != nil && b.Get(fmt.Append(nil, i)) != nil
					require.Equal(t, errs[i] == nil, committed, "request %d: err %v, committed %v", i, errs[i], committed)
				}
				return nil
			}))
			commits, _ := p.Stats()
			t.Logf("%d runs for %d requests, %d failures, %d commits", total, n, failures.Load(), commits)
		})
	}
}
