package idempg_test

import (
	"context"
	"errors"
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

// unrenewed is idempg's backend whose renewals of message claims fail, as
// on a dispatcher cut off from the database or frozen.
type unrenewed struct{ idemcore.Backend[pgx.Tx] }

func (unrenewed) RenewClaim(context.Context, *idemcore.Message) (time.Time, error) {
	return time.Time{}, errors.New("renewal refused")
}

// TestHandlerSeesItsClaimEnd: a handler whose message claim is not renewed
// runs on past the claim's lease while another engine's dispatcher claims
// the message and delivers it. The first handler's context reports the
// claim's end (cause ErrLeaseLost) the moment it has passed (issue 18, item
// 2, for the outbox): by the time the other handler runs, it is ended. Its
// late failure then leaves the message as the other dispatcher holds it
// (a Failed would end that dispatcher's claim), and the message is
// delivered by the other.
func TestHandlerSeesItsClaimEnd(t *testing.T) {
	st := newStore(t, pgtest.Env)
	aIn, bIn, bRelease := make(chan struct{}), make(chan struct{}), make(chan struct{})
	type seen struct {
		err, cause error
	}
	aSaw := make(chan seen, 1)
	handlerA := func(ctx context.Context, m idemcore.Message) error {
		close(aIn)
		select {
		case <-bIn:
		case <-time.After(60 * time.Second): // a bound on a hang, not a timing claim
		}
		aSaw <- seen{ctx.Err(), context.Cause(ctx)}
		return errors.New("A failed late")
	}
	var bRuns atomic.Int32
	handlerB := func(ctx context.Context, m idemcore.Message) error {
		if bRuns.Add(1) == 1 {
			close(bIn)
		}
		<-bRelease
		return nil
	}
	eo := func(h idemcore.Handler) *idemcore.Options {
		return &idemcore.Options{PruneInterval: -1, Outbox: idemcore.OutboxOptions{Dispatch: true,
			Handlers: map[string]idemcore.Handler{"t": h}, PollInterval: 10 * time.Millisecond}}
	}
	a, err := idempg.OpenWrapped(context.Background(), st.pool, &st.opts, eo(handlerA),
		func(b idemcore.Backend[pgx.Tx]) idemcore.Backend[pgx.Tx] { return unrenewed{b} })
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, err := a.DoTx(context.Background(), "order-1", nil, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		return nil, idempg.Enqueue(tx, "t", []byte("x"))
	}); err != nil {
		t.Fatal(err)
	}
	<-aIn
	bOpts := st.opts
	bOpts.Owner = "B"
	b, err := idempg.Open(context.Background(), st.pool, &bOpts, eo(handlerB))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	released := false
	defer func() {
		if !released {
			close(bRelease)
		}
	}()

	s := <-aSaw
	if s.err == nil || !errors.Is(s.cause, idemcore.ErrLeaseLost) {
		t.Errorf("A's handler, while B's handler had its message: ctx.Err() %v, cause %v; want ended by ErrLeaseLost", s.err, s.cause)
	}
	if err := a.Close(); err != nil { // A's delivery has ended
		t.Fatal(err)
	}
	var claimedByB bool
	if err := st.pool.QueryRow(context.Background(), "SELECT coalesce(claimed_by LIKE 'B/%' AND claim_until > now(), false) FROM "+st.opts.Schema+".idem_outbox").Scan(&claimedByB); err != nil {
		t.Fatal(err)
	}
	if !claimedByB {
		t.Error("A's late failure ended B's claim on the message")
	}
	close(bRelease)
	released = true
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) { // a bound on a hang
		var n int
		if err := st.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+st.opts.Schema+".idem_outbox").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("B never delivered the message")
		}
	}
	if n := bRuns.Load(); n != 1 {
		t.Fatalf("B's handler ran %d times, want once", n)
	}
}
