package idempg

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestCrowdCancelledCallers: under a crowd (many Do calls on a pool of 16,
// two claim and completion slots), callers whose context ends while their
// claim is queued or running get their context's error or fn's answer;
// none hangs, an fn that ran is stored (a retry replays it without running
// fn), a caller told its context's error before fn ran leaves the key free
// (a retry runs fn), and the batchers end with nothing running, in flight
// or queued.
func TestCrowdCancelledCallers(t *testing.T) {
	ctx := context.Background()
	e := testEngine(t)
	const n = 400
	var (
		wg   sync.WaitGroup
		ran  [n]atomic.Int32
		told [n]error
	)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, time.Duration(i%9)*4*time.Millisecond)
			defer cancel()
			_, told[i] = e.Do(cctx, fmt.Sprintf("k%d", i), nil, func(context.Context) ([]byte, error) {
				ran[i].Add(1)
				return []byte("ok"), nil
			})
		}()
	}
	wg.Wait()
	for _, q := range []interface {
		counts() (int, int, int)
	}{&e.b.claims, &e.b.completes} {
		if r, in, qu := q.counts(); r != 0 || in != 0 || qu != 0 {
			t.Errorf("batcher after the calls: %d running, %d in flight, %d queued; want none", r, in, qu)
		}
	}
	cancelled := 0
	for i := 0; i < n; i++ {
		k := fmt.Sprintf("k%d", i)
		if told[i] != nil {
			cancelled++
			if !errors.Is(told[i], context.DeadlineExceeded) {
				t.Errorf("%s: %v; want fn's answer or the context's error", k, told[i])
			}
		}
		ranBefore := ran[i].Load()
		res, err := e.Do(ctx, k, nil, func(context.Context) ([]byte, error) {
			ran[i].Add(1)
			return []byte("ok"), nil
		})
		if err != nil || string(res.Response) != "ok" {
			t.Errorf("%s again: %+v, %v", k, res, err)
		}
		if told[i] == nil && (ranBefore != 1 || !res.Replayed) {
			t.Errorf("%s: answered, fn ran %d times, the retry replayed %v; want once, replayed", k, ranBefore, res.Replayed)
		}
		if got := ran[i].Load(); got > 2 || got == 0 {
			t.Errorf("%s: fn ran %d times over both calls", k, got)
		}
	}
	t.Logf("%d of %d calls ended by their context", cancelled, n)
}

func (q *batcher[R]) counts() (running, inflight, queued int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.running, q.inflight, len(q.queue)
}
