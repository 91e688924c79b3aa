package idempg_test

import (
	"context"
	"testing"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idempg/internal/pgtest"
)

// TestEndedFnLapsesLease: once fn has panicked, or returned after its
// context ended (the caller gave up), in a live process, nobody runs it any
// more: its engine ends the claim's lease at once (the started record
// stays, as an interrupted execution), so another process recovers the key
// at once (attempt 2, Recovered) instead of waiting a whole lease; under
// InFlightFail it is not refused as in progress.
func TestEndedFnLapsesLease(t *testing.T) {
	for _, how := range []string{"panic", "cancel"} {
		t.Run(how, func(t *testing.T) {
			st := newStore(t, pgtest.Env)
			st.opts.Lease = 60e9 // a lease no test waits out
			a := st.open(t, nil)
			b := st.open(t, &idemcore.Options{InFlight: idemcore.InFlightFail})
			ctx := context.Background()
			switch how {
			case "panic":
				func() {
					defer func() { _ = recover() }()
					_, _ = a.Do(ctx, "k", []byte("fp"), func(context.Context) ([]byte, error) { panic("fn failed") })
				}()
			case "cancel":
				cctx, cancel := context.WithCancel(ctx)
				_, _ = a.Do(cctx, "k", []byte("fp"), func(ctx context.Context) ([]byte, error) {
					cancel()
					<-ctx.Done()
					return nil, ctx.Err()
				})
			}
			var call idemcore.Call
			res, err := b.Do(ctx, "k", []byte("fp"), func(ctx context.Context) ([]byte, error) {
				call, _ = idemcore.CallFrom(ctx)
				return []byte("B"), nil
			})
			if err != nil {
				t.Fatalf("another process's call after fn ended (%s): %v, want a recovery at once", how, err)
			}
			if string(res.Response) != "B" || res.Attempt != 2 || !call.Recovered {
				t.Fatalf("recovery: %+v, call %+v; want B's answer, attempt 2, recovered", res, call)
			}
		})
	}
}
