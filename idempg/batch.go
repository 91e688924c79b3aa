package idempg

import "sync"

// batcher gathers concurrent requests of one kind into shared statements or
// transactions, as the bbolt engine's commit pipeline does
// (the root package's commit.go): a request that finds fewer than max batches running
// runs at once, alone, with no delay; requests that arrive while max run
// queue, and the next batch to end hands them, up to limit at a time, to a
// new one. run answers every request of its batch.
type batcher[R any] struct {
	run   func([]R)
	max   int
	limit int

	mu      sync.Mutex
	queue   []R
	running int
}

// do runs r in a batch and returns once done is closed (by run).
func (q *batcher[R]) do(r R, done <-chan struct{}) {
	q.mu.Lock()
	if q.running >= q.max {
		q.queue = append(q.queue, r)
		q.mu.Unlock()
		<-done
		return
	}
	q.running++
	q.mu.Unlock()
	q.run([]R{r})
	q.next()
	<-done
}

// next starts a batch of the queued requests, if any, on a goroutine of its
// own (the caller that ran the last one returns at once); else one batch
// fewer runs.
func (q *batcher[R]) next() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.queue) == 0 {
		q.running--
		return
	}
	n := min(len(q.queue), q.limit)
	batch := append([]R(nil), q.queue[:n]...)
	clear(q.queue[:n])
	q.queue = append(q.queue[:0], q.queue[n:]...)
	go func() {
		q.run(batch)
		q.next()
	}()
}

// Batching of Do's claims of free keys and its completions: concurrent
// calls share one statement.
const (
	// maxStmtBatch is the most claims or completions one statement carries.
	maxStmtBatch = 64
	// stmtBatchShare sets how many of Do's batched claims and completions
	// run at once: one per stmtBatchShare connections (at least two). They
	// hold no user code, so fewer, fuller batches cost no one a wait and
	// save commits: at 64 callers on a pool of 64, 8 slots gave 1.5x the
	// first executions of 32 (bench/RESULTS.md).
	stmtBatchShare = 8
)
