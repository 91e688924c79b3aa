package idempg_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idempg"
	"github.com/idemkit/idem/idempg/internal/pgtest"
)

// TestOpenRefusesWhatPostgresWouldRefuse: options Postgres would refuse at
// the first call (a lock_timeout or idle_in_transaction_session_timeout
// above INT_MAX milliseconds, an Owner text cannot hold) are refused by
// Open with ErrOptions, and no engine is opened.
func TestOpenRefusesWhatPostgresWouldRefuse(t *testing.T) {
	st := newStore(t, pgtest.Env)
	ctx := context.Background()
	over := time.Duration(math.MaxInt32+1) * time.Millisecond // just past INT_MAX ms (24.8 days)
	for name, o := range map[string]idempg.Options{
		"Lease above INT_MAX ms (the default idle timeout)": {Lease: over},
		"Lease of the largest Duration":                     {Lease: math.MaxInt64},
		"LockTimeout above INT_MAX ms":                      {LockTimeout: over},
		"IdleInTransactionTimeout above INT_MAX ms":         {IdleInTransactionTimeout: over},
		"Owner with NUL":                                    {Owner: "web\x001"},
		"Owner not UTF-8":                                   {Owner: "web\xff"},
	} {
		o.Schema = st.opts.Schema
		e, err := idempg.Open(ctx, st.pool, &o, nil)
		if !errors.Is(err, idempg.ErrOptions) || e != nil {
			t.Errorf("%s: %v, %v; want ErrOptions and no engine", name, e, err)
			if e != nil {
				_ = e.Close()
			}
		}
	}
	// The largest accepted values work.
	max := time.Duration(math.MaxInt32) * time.Millisecond
	o := st.opts
	o.Lease, o.LockTimeout, o.Owner = max, max, "web-1 ✓"
	e, err := idempg.Open(ctx, st.pool, &o, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if _, err := e.Do(ctx, "k", nil, func(context.Context) ([]byte, error) { return []byte("ok"), nil }); err != nil {
		t.Fatalf("Do with INT_MAX ms timeouts: %v", err)
	}
	if _, err := e.DoTx(ctx, "t", nil, func(context.Context, pgx.Tx) ([]byte, error) { return []byte("ok"), nil }); err != nil {
		t.Fatalf("DoTx with INT_MAX ms timeouts: %v", err)
	}
}

// TestEnqueueRefusesNUL: a topic or ordering key holding NUL is refused
// with idemcore.ErrInvalidMessage before it reaches the server (which would
// abort fn's transaction), and fn's transaction stays usable.
func TestEnqueueRefusesNUL(t *testing.T) {
	st := newStore(t, pgtest.Env)
	e := st.open(t, nil)
	ctx := context.Background()
	for name, c := range map[string]struct{ topic, ordering string }{
		"topic": {"char\x00ge", ""}, "ordering key": {"charge", "order\x001"},
	} {
		_, err := e.DoTx(ctx, "k-"+name, nil, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			if err := idempg.EnqueueOrdered(tx, c.topic, c.ordering, nil); !errors.Is(err, idemcore.ErrInvalidMessage) {
				t.Errorf("%s with NUL: %v, want ErrInvalidMessage", name, err)
			}
			var one int
			return nil, tx.QueryRow(ctx, "SELECT 1").Scan(&one)
		})
		if err != nil {
			t.Errorf("%s: the transaction after a refused Enqueue: %v", name, err)
		}
	}
}
