package idempg

import (
	"context"
	"slices"
	"sync"
)

// batcher gathers concurrent requests of one kind into shared statements or
// transactions, as the bbolt engine's commit pipeline does (the root
// package's commit.go): a request that finds fewer than max batches
// running runs at once, alone, with no delay (the lone caller never waits
// for a batch to form); requests that arrive while max run queue, and the
// next batch to end hands the queue (at most limit of it) to a new one. So
// batches form only from requests that would otherwise queue inside the
// server, and their size follows the crowd.
//
// What bounds the statements in flight is the server, not the pool: at 64
// callers on a pool of 64 and two cores, running a statement whenever a
// connection was idle kept up to 64 in the server at once and formed no
// batch; a fixed number of slots per kind (stmtBatchShare) formed batches
// and raised the first executions (bench/RESULTS.md, "Issue 21: claim
// first, and batches behind busy slots"). Under a crowd (crowd requests in
// the batcher, running or queued) only min batches run, so that the
// batches are fuller still.
type batcher[R comparable] struct {
	run   func([]R)
	max   int
	limit int
	// crowd, if set, is the number of requests (running and queued) from
	// which at most min batches run: under a crowd, fewer and fuller
	// batches. Below it, up to max run.
	crowd, min int

	mu       sync.Mutex
	queue    []R
	running  int // batches running
	inflight int // requests in the running batches
}

// do runs r in a batch and returns nil once done is closed (by run). A
// request still queued when ctx ends leaves the queue unsent, and do
// returns ctx's error; one already sent (in a running batch) is answered,
// whatever ctx says, so that its caller knows what was stored.
func (q *batcher[R]) do(ctx context.Context, r R, done <-chan struct{}) error {
	q.mu.Lock()
	if q.running >= q.slots() {
		q.queue = append(q.queue, r)
		q.mu.Unlock()
		select {
		case <-done:
			return nil
		case <-ctx.Done():
		}
		q.mu.Lock()
		if i := slices.Index(q.queue, r); i >= 0 {
			q.queue = slices.Delete(q.queue, i, i+1)
			q.mu.Unlock()
			return context.Cause(ctx)
		}
		q.mu.Unlock()
		<-done // taken by a batch meanwhile
		return nil
	}
	q.running++
	q.inflight++
	q.mu.Unlock()
	q.run([]R{r})
	q.next(1)
	<-done
	return nil
}

// next ends a batch of ended requests and starts one of the queued
// requests, if any (at most limit), on a goroutine of its own (the caller
// that ran the last one returns at once); else one batch fewer runs.
func (q *batcher[R]) next(ended int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.inflight -= ended
	if len(q.queue) == 0 || q.running > q.slots() {
		// No work, or more batches run than the crowd should have: the
		// others (at least min) take the queue as they end.
		q.running--
		return
	}
	n := min(len(q.queue), q.limit)
	batch := append([]R(nil), q.queue[:n]...)
	clear(q.queue[:n])
	q.queue = append(q.queue[:0], q.queue[n:]...)
	q.inflight += n
	go func() {
		q.run(batch)
		q.next(n)
	}()
}

// slots is how many batches may run now: max, or min under a crowd.
// q.mu is held.
func (q *batcher[R]) slots() int {
	if q.crowd > 0 && q.inflight+len(q.queue) >= q.crowd {
		return q.min
	}
	return q.max
}

// Batching of Do's claims of free keys and its completions: concurrent
// calls share one statement.
const (
	// maxStmtBatch is the most claims or completions one statement carries.
	maxStmtBatch = 64
	// stmtBatchShare sets how many of Do's claim statements, and how many
	// of its completion statements, run at once: one per stmtBatchShare
	// connections of the pool (at least two); more wait for one to end and
	// go in its next batch. They hold no user code, so fewer, fuller
	// batches cost no one a wait and save commits and the server's
	// per-statement work (bench/RESULTS.md, "Issue 21: claim first, and
	// batches behind busy slots").
	stmtBatchShare = 8
	// stmtCrowd and crowdSlots: once stmtCrowd times as many claims (or
	// completions) as slots are in the batcher, running or queued, only
	// crowdSlots batches of the kind run, fuller. With 64 callers on a pool
	// of 64, 2 slots instead of 8 raised the first executions by a third
	// and 8 kept 8 callers' best (bench/RESULTS.md, "Issue 21: cheaper
	// statements"): the crowd's rule takes the first without the second's
	// loss.
	stmtCrowd  = 2
	crowdSlots = 2
)
