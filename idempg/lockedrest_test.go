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

// TestFreshClaimsBesideLockedExpiredRows: Do calls of fresh keys, batched
// with calls of keys whose expired rows another transaction holds locked
// (as an operator's Resolve does while its fn runs), run fn once each as a
// first execution: no fresh key is taken for an interrupted execution
// (Recovered, attempt 2, or ErrIncomplete under RecoverRefuse) because
// the batch's claim of the other keys waited out lock_timeout.
func TestFreshClaimsBesideLockedExpiredRows(t *testing.T) {
	st := newStore(t, pgtest.Env)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	old := st.open(t, &idemcore.Options{Retention: time.Minute})
	const nExp, nFresh = 8, 48
	for i := 0; i < nExp; i++ {
		if _, err := old.Do(ctx, fmt.Sprintf("exp-%d", i), nil, func(context.Context) ([]byte, error) { return []byte("old"), nil }); err != nil {
			t.Fatal(err)
		}
	}
	st.offset.Add(int64(2 * time.Minute))
	e := st.openWith(t, idempg.Options{LockTimeout: 50 * time.Millisecond}, 0,
		&idemcore.Options{Retention: time.Minute, Recovery: idemcore.RecoverRefuse})
	tx, err := st.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf(`SELECT key FROM %q.idem_records WHERE key LIKE 'exp-%%' FOR UPDATE`, st.opts.Schema)); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	call := func(k string) {
		defer wg.Done()
		res, err := e.Do(ctx, k, nil, func(ctx context.Context) ([]byte, error) {
			c, _ := idemcore.CallFrom(ctx)
			if c.Recovered || c.Attempt != 1 {
				t.Errorf("%s: fn runs as attempt %d, recovered %v; want a first execution", k, c.Attempt, c.Recovered)
			}
			return []byte("new"), nil
		})
		if err != nil || string(res.Response) != "new" || res.Replayed {
			t.Errorf("%s: %+v, %v; want fn's answer", k, res, err)
		}
	}
	for r := 0; r < 3; r++ {
		for i := 0; i < nFresh; i++ {
			if i < nExp && r == 0 {
				wg.Add(1)
				go call(fmt.Sprintf("exp-%d", i))
			}
			wg.Add(1)
			go call(fmt.Sprintf("fresh-%d-%d", r, i))
		}
		time.Sleep(20 * time.Millisecond) // more rounds while the expired keys' claims wait
	}
	time.Sleep(200 * time.Millisecond)
	_ = tx.Rollback(ctx)
	wg.Wait()
}
