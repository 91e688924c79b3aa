package idempg_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idempg"
	"github.com/idemkit/idem/idempg/internal/pgtest"
)

// gate returns the channels of a blocking fn and free, which releases it
// (once); free also runs at cleanup, before the engines close, so a failed
// test does not leave the fn holding Close.
func gate(t *testing.T) (chan context.Context, chan struct{}, func()) {
	started, release := make(chan context.Context, 1), make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free)
	return started, release, free
}

// TestSharedOwnerLabel: two engines with the same Options.Owner (one label
// for every replica of a service) never take each other's live claims for
// their own: while A's fn runs, B's call of the key is refused (InFlightFail)
// or waits for A's outcome, for Do and DoTx alike; fn runs once.
func TestSharedOwnerLabel(t *testing.T) {
	for _, mode := range []string{"do", "dotx"} {
		t.Run(mode, func(t *testing.T) {
			st := newStore(t, pgtest.Env)
			a := st.openWith(t, idempg.Options{Owner: "orders"}, 0, nil)
			bFail := st.openWith(t, idempg.Options{Owner: "orders"}, 0, &idemcore.Options{InFlight: idemcore.InFlightFail})
			bWait := st.openWith(t, idempg.Options{Owner: "orders"}, 0, nil)
			ctx := context.Background()
			started, release, free := gate(t)
			aDone := make(chan error, 1)
			go func() {
				_, err := a.Do(ctx, "k", []byte("fp"), blocking("A", started, release))
				aDone <- err
			}()
			<-started
			var runs atomic.Int32
			other := func(context.Context) ([]byte, error) { runs.Add(1); return []byte("B"), nil }
			call := func(e *idempg.Engine) (idemcore.Result, error) {
				if mode == "do" {
					return e.Do(ctx, "k", []byte("fp"), other)
				}
				return e.DoTx(ctx, "k", []byte("fp"), func(ctx context.Context, _ pgx.Tx) ([]byte, error) { return other(ctx) })
			}
			if _, err := call(bFail); !errors.Is(err, idemcore.ErrInProgress) {
				t.Fatalf("a call of a key another engine with the same Owner runs: %v, want ErrInProgress", err)
			}
			waited := make(chan error, 1)
			var res idemcore.Result
			go func() {
				var err error
				res, err = call(bWait)
				waited <- err
			}()
			free()
			if err := <-aDone; err != nil {
				t.Fatalf("A: %v", err)
			}
			if err := <-waited; err != nil {
				t.Fatal(err)
			}
			if string(res.Response) != "A" || !res.Replayed || runs.Load() != 0 {
				t.Fatalf("the waiter got %q replayed=%v, its fn ran %d times; want A's answer", res.Response, res.Replayed, runs.Load())
			}
		})
	}
}
