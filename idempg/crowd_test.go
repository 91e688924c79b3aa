package idempg_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idempg"
	"github.com/idemkit/idem/idempg/internal/pgtest"
)

// TestCrowdAcrossEngines: many concurrent duplicates of fresh, live and
// expired-but-not-pruned keys, through Do and DoTx of two engines on one
// schema, each with a pool of 16 (two claim slots, so that claims batch and
// a crowd forms): fn runs once per fresh or expired key and never for a
// live one, and every caller of a key gets the same answer.
func TestCrowdAcrossEngines(t *testing.T) {
	for _, env := range []string{pgtest.Env, pgtest.BouncerEnv} {
		t.Run(env, func(t *testing.T) {
			st := newStore(t, env)
			eo := func() *idemcore.Options { return &idemcore.Options{Retention: time.Minute} }
			engines := [2]*idempg.Engine{st.open(t, eo()), st.open(t, eo())}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			const n = 24
			kinds := []string{"fresh", "live", "expired"}
			// The expired keys' records, then the clock past their window;
			// then the live keys' records.
			for _, kind := range []string{"expired", "live"} {
				for i := 0; i < n; i++ {
					k := fmt.Sprintf("%s-%d", kind, i)
					if _, err := engines[i%2].Do(ctx, k, []byte("fp"), func(context.Context) ([]byte, error) { return []byte("old:" + k), nil }); err != nil {
						t.Fatal(err)
					}
				}
				if kind == "expired" {
					st.offset.Add(int64(2 * time.Minute))
				}
			}
			var (
				runs    sync.Map // key → *atomic.Int32
				answers sync.Map // key → first answer
				wg      sync.WaitGroup
			)
			count := func(k string) *atomic.Int32 {
				v, _ := runs.LoadOrStore(k, new(atomic.Int32))
				return v.(*atomic.Int32)
			}
			for g := 0; g < 8; g++ {
				for _, kind := range kinds {
					for i := 0; i < n; i++ {
						k := fmt.Sprintf("%s-%d", kind, i)
						e := engines[(g+i)%2]
						tx := (g+i)%3 == 0
						wg.Add(1)
						go func() {
							defer wg.Done()
							var (
								res idemcore.Result
								err error
							)
							name := fmt.Sprintf("new:%s:%d", k, g)
							if tx {
								res, err = e.DoTx(ctx, k, []byte("fp"), func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
									count(k).Add(1)
									var one int
									if err := tx.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
										return nil, err
									}
									return []byte(name), nil
								})
							} else {
								res, err = e.Do(ctx, k, []byte("fp"), func(context.Context) ([]byte, error) {
									count(k).Add(1)
									return []byte(name), nil
								})
							}
							if err != nil {
								t.Errorf("%s: %v", k, err)
								return
							}
							if prev, loaded := answers.LoadOrStore(k, string(res.Response)); loaded && prev.(string) != string(res.Response) {
								t.Errorf("%s: answers %q and %q", k, prev, res.Response)
							}
						}()
					}
				}
			}
			wg.Wait()
			for _, kind := range kinds {
				for i := 0; i < n; i++ {
					k := fmt.Sprintf("%s-%d", kind, i)
					want := int32(1)
					if kind == "live" {
						want = 0
					}
					if got := count(k).Load(); got != want {
						t.Errorf("%s: fn ran %d times, want %d", k, got, want)
					}
					a, _ := answers.Load(k)
					if kind == "live" && a != "old:"+k {
						t.Errorf("%s: answered %q, want the stored %q", k, a, "old:"+k)
					}
				}
			}
		})
	}
}
