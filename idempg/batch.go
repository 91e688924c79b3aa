package idempg

import (
	"context"
	"slices"
	"sync"
)

// batcher gathers concurrent requests of one kind into shared statements or
// transactions, as the bbolt engine's commit pipeline does (the root
// package's commit.go): a request that finds fewer than max batches
// running, or a connection of the pool idle, runs at once, alone, with no
// delay (no caller waits for a batch to form while a connection could send
// its statement); requests that arrive while max run and the pool has no
// idle connection queue, and the next batch to end hands them to new ones:
// as many batches as the pool then has idle connections, plus one, each of
// an equal share of the queue (at most limit). So batches form only from
// the requests that would otherwise wait for a connection, and their size
// follows that wait. run answers every request of its batch.
type batcher[R comparable] struct {
	run   func([]R)
	max   int
	limit int
	idle  func() int // the pool's idle connections; nil: none counted

	mu      sync.Mutex
	queue   []R
	running int
}

// do runs r in a batch and returns nil once done is closed (by run). A
// request still queued when ctx ends leaves the queue unsent, and do
// returns ctx's error; one already sent (in a running batch) is answered,
// whatever ctx says, so that its caller knows what was stored.
func (q *batcher[R]) do(ctx context.Context, r R, done <-chan struct{}) error {
	q.mu.Lock()
	if q.running >= q.max && q.idleConns() == 0 {
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
	q.mu.Unlock()
	q.run([]R{r})
	q.next()
	<-done
	return nil
}

// idleConns is the pool's idle connections, 0 if not counted.
func (q *batcher[R]) idleConns() int {
	if q.idle == nil {
		return 0
	}
	return q.idle()
}

// next starts batches of the queued requests, if any, each on a goroutine
// of its own (the caller that ran the last one returns at once): one, and
// one more per idle connection of the pool, the queue shared equally among
// them; else one batch fewer runs.
func (q *batcher[R]) next() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.queue) == 0 {
		q.running--
		return
	}
	parts := min(len(q.queue), 1+q.idleConns())
	size := min((len(q.queue)+parts-1)/parts, q.limit)
	for i := 0; i < parts && len(q.queue) > 0; i++ {
		n := min(len(q.queue), size)
		batch := append([]R(nil), q.queue[:n]...)
		clear(q.queue[:n])
		q.queue = append(q.queue[:0], q.queue[n:]...)
		if i > 0 {
			q.running++
		}
		go func() {
			q.run(batch)
			q.next()
		}()
	}
}

// Batching of Do's claims of free keys and its completions: concurrent
// calls share one statement.
const (
	// maxStmtBatch is the most claims or completions one statement carries.
	maxStmtBatch = 64
	// stmtBatchShare sets how many of Do's batched claims and completions
	// run at once while the pool has no idle connection: one per
	// stmtBatchShare connections (at least two). They hold no user code, so
	// fewer, fuller batches cost no one a wait and save commits: at 64
	// callers on a pool of 64, 8 slots gave 1.5x the first executions of 32
	// (bench/RESULTS.md).
	stmtBatchShare = 8
)
