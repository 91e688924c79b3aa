package idempg_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idempg"
	"github.com/idemkit/idem/idempg/internal/pgtest"
)

// TestStarvedRenewalCancelsFn: when A's renewal cannot run (every
// connection of A's pool is busy, so the renewal waits for one), A's fn's
// context is cancelled with cause ErrLeaseLost once the lease lapses, before
// another engine takes the key over and runs fn: never two fns of one key
// with live contexts. (A blackholed connection hangs a renewal the same way.)
func TestStarvedRenewalCancelsFn(t *testing.T) {
	st := newStore(t, pgtest.Env)
	cfg, err := pgxpool.ParseConfig(pgtest.DSN(t, pgtest.Env))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	poolA, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(poolA.Close)
	oa := idempg.Options{Schema: st.opts.Schema, Lease: 2 * time.Second, PollInterval: 20 * time.Millisecond}
	a, err := idempg.Open(context.Background(), poolA, &oa, &idemcore.Options{PruneInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	b := st.open(t, nil)
	ctx := context.Background()

	aCtx := make(chan context.Context, 1)
	aDone := make(chan error, 1)
	go func() {
		_, err := a.Do(ctx, "k", []byte("fp"), func(ctx context.Context) ([]byte, error) {
			aCtx <- ctx
			<-ctx.Done()
			return nil, ctx.Err()
		})
		aDone <- err
	}()
	fnCtx := <-aCtx
	// Take A's only connection: its renewals wait for the pool.
	held, err := poolA.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var alive bool
	var cause error
	bctx, cancel := context.WithTimeout(ctx, 30*time.Second) // a hang guard, not an assertion
	defer cancel()
	res, err := b.Do(bctx, "k", []byte("fp"), func(ctx context.Context) ([]byte, error) {
		alive, cause = fnCtx.Err() == nil, context.Cause(fnCtx)
		return []byte("B"), nil
	})
	held.Release()
	aErr := <-aDone
	_ = a.Close()
	if err != nil {
		t.Fatalf("B's takeover: %v", err)
	}
	if res.Attempt != 2 {
		t.Errorf("B's attempt %d, want 2 (a takeover)", res.Attempt)
	}
	if alive {
		t.Fatal("B's fn ran while A's fn's context was still live: A's starved renewal never ended it")
	}
	if !errors.Is(cause, idemcore.ErrLeaseLost) {
		t.Errorf("A's fn's context ended with cause %v, want ErrLeaseLost", cause)
	}
	if aErr == nil {
		t.Error("A's Do after its lease lapsed: no error")
	}
}
