package idempg_test

import (
	"context"
	"errors"
	"testing"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idempg/internal/pgtest"
)

// TestOperatorRefusesLiveClaimElsewhere: Resolve and Forget from another
// engine (another process) while a call runs with a live lease are refused
// with ErrInProgress, as they are in the engine that runs it; the call's
// outcome is then stored and replayed. Once the lease has lapsed (an
// interrupted execution), Resolve completes it.
func TestOperatorRefusesLiveClaimElsewhere(t *testing.T) {
	st := newStore(t, pgtest.Env)
	a := st.open(t, nil)
	op := st.open(t, nil)
	ctx := context.Background()
	started, release, free := gate(t)
	aDone := make(chan error, 1)
	go func() {
		_, err := a.Do(ctx, "k", []byte("fp"), blocking("A", started, release))
		aDone <- err
	}()
	<-started
	if err := op.Resolve("k", []byte("by hand"), nil); !errors.Is(err, idemcore.ErrInProgress) {
		t.Errorf("Resolve of a call running elsewhere: %v, want ErrInProgress", err)
	}
	if err := op.Forget("k"); !errors.Is(err, idemcore.ErrInProgress) {
		t.Errorf("Forget of a call running elsewhere: %v, want ErrInProgress", err)
	}
	free()
	if err := <-aDone; err != nil {
		t.Fatalf("the running call after the operator calls: %v", err)
	}
	res, err := op.Do(ctx, "k", []byte("fp"), func(context.Context) ([]byte, error) { return []byte("again"), nil })
	if err != nil || string(res.Response) != "A" || !res.Replayed {
		t.Fatalf("after the call: %+v, %v; want A's answer replayed", res, err)
	}

	// An interrupted execution (lease lapsed) is the operator's to resolve.
	if _, err := st.pool.Exec(ctx, "UPDATE "+st.opts.Schema+".idem_records SET state = 1, lease_until = now() + interval '1 hour', owner = 'elsewhere', completed_ns = 0, response = NULL WHERE key = 'k'"); err != nil {
		t.Fatal(err)
	}
	if err := op.Resolve("k", []byte("by hand"), nil); !errors.Is(err, idemcore.ErrInProgress) {
		t.Fatalf("Resolve of a started record with a live lease: %v, want ErrInProgress", err)
	}
	lapse(t, st)
	if err := op.Resolve("k", []byte("by hand"), nil); err != nil {
		t.Fatalf("Resolve of an interrupted execution: %v", err)
	}
	if _, err := st.pool.Exec(ctx, "UPDATE "+st.opts.Schema+".idem_records SET state = 1, lease_until = now() + interval '1 hour', owner = 'elsewhere', completed_ns = 0, response = NULL WHERE key = 'k'"); err != nil {
		t.Fatal(err)
	}
	if err := op.Forget("k"); !errors.Is(err, idemcore.ErrInProgress) {
		t.Fatalf("Forget of a started record with a live lease: %v, want ErrInProgress", err)
	}
	lapse(t, st)
	if err := op.Forget("k"); err != nil {
		t.Fatalf("Forget of an interrupted execution: %v", err)
	}
}

// lapse ends the lease of st's key k.
func lapse(t *testing.T, st *store) {
	t.Helper()
	if _, err := st.pool.Exec(context.Background(), "UPDATE "+st.opts.Schema+".idem_records SET lease_until = 'epoch' WHERE key = 'k'"); err != nil {
		t.Fatal(err)
	}
}
