package idempg_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idempg"
	"github.com/idemkit/idem/idempg/internal/pgtest"
)

// TestSlowHandlerKeepsItsClaim: a handler that runs longer than the claim's
// lease (Options.Lease, by the database's clock) is not delivered again
// meanwhile, by its own dispatcher or another engine's: the dispatcher
// renews the claims of the messages whose handlers run. The database's clock
// is moved on by half a lease at a time, each step waiting for a renewal
// past it; two whole leases pass while the handler runs, and it ran once.
func TestSlowHandlerKeepsItsClaim(t *testing.T) {
	st := newStore(t, pgtest.Env)
	var attempts atomic.Int32
	entered, release := make(chan struct{}, 8), make(chan struct{})
	handler := func(ctx context.Context, m idemcore.Message) error {
		attempts.Add(1)
		entered <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	}
	eo := func() *idemcore.Options {
		return &idemcore.Options{Outbox: idemcore.OutboxOptions{Dispatch: true, Workers: 4,
			Handlers: map[string]idemcore.Handler{"slow": handler}, PollInterval: 10 * time.Millisecond}}
	}
	a, _ := st.open(t, eo()), st.open(t, eo())
	ctx := context.Background()
	if _, err := a.DoTx(ctx, "order-1", nil, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		return nil, idempg.Enqueue(tx, "slow", []byte("x"))
	}); err != nil {
		t.Fatal(err)
	}
	<-entered
	defer close(release)
	claimAhead := func() bool { // the claim ends more than half a lease after the database's now
		var ahead bool
		err := st.pool.QueryRow(ctx, "SELECT claim_until > now() + $1::interval + $2::interval FROM "+st.opts.Schema+".idem_outbox",
			time.Duration(st.offset.Load()).String(), (st.opts.Lease / 2).String()).Scan(&ahead)
		return err == nil && ahead
	}
	for step := range 4 {
		st.offset.Add(int64(st.opts.Lease / 2))
		deadline := time.Now().Add(30 * time.Second) // a bound on a hang, not a timing claim
		for !claimAhead() {
			if time.Now().After(deadline) {
				t.Fatalf("step %d: the running handler's claim was not renewed (attempts %d)", step, attempts.Load())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if n := attempts.Load(); n != 1 {
		t.Fatalf("the message was delivered %d times while its handler ran, want once", n)
	}
}
