package idempg_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idempg"
	"github.com/idemkit/idem/idempg/internal/pgtest"
)

// TestWaitersWokenByBatchedCompletions: waiters in another engine, which
// polls only every ten minutes, are woken by the notifications that the
// completions' own RETURNING sends (pg_notify of a marked row), lone and
// batched completions alike: each gets its key's answer, fn ran once.
func TestWaitersWokenByBatchedCompletions(t *testing.T) {
	st := newStore(t, pgtest.Env)
	a := st.open(t, nil)
	waiting := make(chan struct{}, 64)
	w := st.openWith(t, idempg.Options{PollInterval: 10 * time.Minute}, 0,
		&idemcore.Options{Observer: waitCounter(waiting)})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const n = 32
	release := make(chan struct{})
	var started, wg sync.WaitGroup
	for i := 0; i < n; i++ {
		k := fmt.Sprintf("k%d", i)
		started.Add(1)
		wg.Add(2)
		go func() {
			defer wg.Done()
			res, err := a.Do(ctx, k, nil, func(context.Context) ([]byte, error) {
				started.Done()
				<-release
				return []byte("A" + k), nil
			})
			if err != nil || string(res.Response) != "A"+k {
				t.Errorf("%s: %+v, %v", k, res, err)
			}
		}()
		go func() {
			defer wg.Done()
			started.Wait()
			res, err := w.Do(ctx, k, nil, func(context.Context) ([]byte, error) {
				t.Errorf("%s: the waiter's fn ran", k)
				return nil, nil
			})
			if err != nil || string(res.Response) != "A"+k || !res.Replayed {
				t.Errorf("waiter of %s: %+v, %v; want A's answer replayed", k, res, err)
			}
		}()
	}
	for i := 0; i < n; i++ {
		<-waiting
	}
	close(release)
	wg.Wait()
}

// waitCounter sends on its channel for each EventWait, dropping what its
// buffer cannot take (the test counts the first n).
type waitCounter chan struct{}

func (w waitCounter) Observe(ev idemcore.Event) {
	if ev.Kind == idemcore.EventWait {
		select {
		case w <- struct{}{}:
		default:
		}
	}
}
