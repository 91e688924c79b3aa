package idempg

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"sync"
	"testing"
)

// waitFor returns once cond, called under q's lock, holds.
func (q *batcher[R]) waitFor(cond func() bool) {
	for {
		q.mu.Lock()
		ok := cond()
		q.mu.Unlock()
		if ok {
			return
		}
		runtime.Gosched()
	}
}

// batchReq is a request of the batcher tests.
type batchReq struct {
	id   int
	done chan struct{}
}

// parkingRun makes q's batches park while they start with a request of id
// 0, until release is closed, and record the sizes of the others (read
// under mu once they ended).
func parkingRun(q *batcher[*batchReq]) (release chan struct{}, sizes func() []int) {
	release = make(chan struct{})
	var (
		mu  sync.Mutex
		got []int
	)
	q.run = func(rs []*batchReq) {
		if rs[0].id == 0 {
			<-release
		}
		mu.Lock()
		if rs[0].id != 0 {
			got = append(got, len(rs))
		}
		mu.Unlock()
		for _, r := range rs {
			close(r.done)
		}
	}
	return release, func() []int {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
}

// TestBatcherHonoursContext: a request queued behind a running batch whose
// context ends leaves the queue unsent and gets its context's error; the
// others queued with it run in the next batch.
func TestBatcherHonoursContext(t *testing.T) {
	release := make(chan struct{})
	var (
		mu  sync.Mutex
		ran []int
	)
	q := &batcher[*batchReq]{max: 1, limit: 8}
	q.run = func(rs []*batchReq) {
		if rs[0].id == 0 {
			<-release
		}
		mu.Lock()
		for _, r := range rs {
			ran = append(ran, r.id)
			close(r.done)
		}
		mu.Unlock()
	}
	first := &batchReq{id: 0, done: make(chan struct{})}
	firstDone := make(chan error, 1)
	go func() { firstDone <- q.do(context.Background(), first, first.done) }()
	q.waitFor(func() bool { return q.running > 0 })

	ctx, cancel := context.WithCancelCause(context.Background())
	gone := &batchReq{id: 1, done: make(chan struct{})}
	kept := &batchReq{id: 2, done: make(chan struct{})}
	goneErr, keptErr := make(chan error, 1), make(chan error, 1)
	go func() { goneErr <- q.do(ctx, gone, gone.done) }()
	go func() { keptErr <- q.do(context.Background(), kept, kept.done) }()
	q.waitFor(func() bool { return len(q.queue) == 2 })
	cause := errors.New("the caller gave up")
	cancel(cause)
	if err := <-goneErr; !errors.Is(err, cause) {
		t.Fatalf("a queued request whose context ended: %v, want its cause", err)
	}
	close(release)
	if err := <-firstDone; err != nil {
		t.Fatal(err)
	}
	if err := <-keptErr; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(ran) != 2 || ran[0] != 0 || ran[1] != 2 {
		t.Errorf("requests run: %v, want [0 2] (the one whose context ended never sent)", ran)
	}
}

// TestBatcherQueuesOnlyBehindFullSlots: a request that finds a slot free
// runs at once, alone; one that finds every slot taken queues, and the
// queue goes in batches of at most limit once a slot frees.
func TestBatcherQueuesOnlyBehindFullSlots(t *testing.T) {
	q := &batcher[*batchReq]{max: 2, limit: 4}
	release, sizes := parkingRun(q)
	first := &batchReq{id: 0, done: make(chan struct{})}
	go func() { _ = q.do(context.Background(), first, first.done) }()
	q.waitFor(func() bool { return q.running == 1 })

	// A slot is free: the second runs alone, at once (the first still holds
	// its slot).
	second := &batchReq{id: 1, done: make(chan struct{})}
	if err := q.do(context.Background(), second, second.done); err != nil {
		t.Fatal(err)
	}
	// Both slots taken (the second's slot is held by a request parked the
	// same way as the first): six queue.
	third := &batchReq{id: 0, done: make(chan struct{})}
	go func() { _ = q.do(context.Background(), third, third.done) }()
	q.waitFor(func() bool { return q.running == 2 })
	var wg sync.WaitGroup
	for i := 2; i <= 7; i++ {
		r := &batchReq{id: i, done: make(chan struct{})}
		wg.Go(func() { _ = q.do(context.Background(), r, r.done) })
	}
	q.waitFor(func() bool { return len(q.queue) == 6 })
	close(release)
	wg.Wait()
	got := sizes()
	total := 0
	for _, n := range got[1:] {
		if n > 4 {
			t.Errorf("a batch of %d, over the limit of 4", n)
		}
		total += n
	}
	if got[0] != 1 || total != 6 || len(got) < 3 {
		t.Errorf("batch sizes %v, want [1] (the lone request) then the six queued in batches of at most 4", got)
	}
}

// TestBatcherCrowdTakesFewerSlots: once as many requests as crowd are in
// the batcher (running or queued), a request queues behind min running
// batches although fewer than max run, and the queue goes in one batch.
func TestBatcherCrowdTakesFewerSlots(t *testing.T) {
	q := &batcher[*batchReq]{max: 4, limit: 64, crowd: 3, min: 2}
	release, sizes := parkingRun(q)
	var wg sync.WaitGroup
	do := func(r *batchReq) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := q.do(context.Background(), r, r.done); err != nil {
				t.Error(err)
			}
		}()
	}
	// Three requests, each in a batch of its own: below the crowd, up to
	// max run.
	for i := range 3 {
		do(&batchReq{id: 0, done: make(chan struct{})})
		q.waitFor(func() bool { return q.running == i+1 })
	}
	// Three in the batcher: the crowd. Three run, more than min: these
	// queue.
	for i := range 2 {
		do(&batchReq{id: 1, done: make(chan struct{})})
		q.waitFor(func() bool { return len(q.queue) == i+1 })
	}
	q.mu.Lock()
	running := q.running
	q.mu.Unlock()
	if running != 3 {
		t.Errorf("%d batches run, want 3 (the crowd's requests queue, not run in a fourth)", running)
	}
	close(release)
	wg.Wait()
	if got := sizes(); len(got) != 1 || got[0] != 2 {
		t.Errorf("queued requests ran in batches of %v, want one batch of 2", got)
	}
	// The last batch's goroutine ends its batch after answering.
	q.waitFor(func() bool { return q.running == 0 && q.inflight == 0 })
}
