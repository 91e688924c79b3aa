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

// openWith opens an engine on st's schema with o's backend settings, and its
// database clock offset by offset.
func (st *store) openWith(t *testing.T, o idempg.Options, offset time.Duration, eo *idemcore.Options) *idempg.Engine {
	t.Helper()
	o.Schema = st.opts.Schema
	o.PollOnly = st.opts.PollOnly
	idempg.SetClockOffset(&o, func() time.Duration { return time.Duration(st.offset.Load()) + offset })
	if eo == nil {
		eo = &idemcore.Options{}
	}
	eo.PruneInterval = -1
	e, err := idempg.Open(context.Background(), st.pool, &o, eo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// blocking returns an fn that reports its context on started and returns
// resp once release is closed (whatever its context).
func blocking(resp string, started chan<- context.Context, release <-chan struct{}) func(context.Context) ([]byte, error) {
	return func(ctx context.Context) ([]byte, error) {
		started <- ctx
		<-release
		return []byte(resp), nil
	}
}

// TestOwnedElsewhere: a key held by a live lease in another engine is never
// recovered: a call fails fast with an *InProgressError and its RetryAfter,
// or waits and answers from the owner's outcome.
func TestOwnedElsewhere(t *testing.T) {
	for _, env := range []string{pgtest.Env, pgtest.BouncerEnv} {
		t.Run(env, func(t *testing.T) {
			st := newStore(t, env)
			a := st.open(t, nil)
			bFail := st.open(t, &idemcore.Options{InFlight: idemcore.InFlightFail, RetryAfter: 3 * time.Second})
			bWait := st.open(t, nil)
			ctx := context.Background()
			started, release := make(chan context.Context, 1), make(chan struct{})
			aDone := make(chan error, 1)
			go func() {
				_, err := a.Do(ctx, "k", []byte("fp"), blocking("A", started, release))
				aDone <- err
			}()
			<-started
			var runs atomic.Int32
			other := func(context.Context) ([]byte, error) { runs.Add(1); return []byte("B"), nil }

			_, err := bFail.Do(ctx, "k", []byte("fp"), other)
			var ip *idemcore.InProgressError
			if !errors.As(err, &ip) || !errors.Is(err, idemcore.ErrInProgress) {
				t.Fatalf("InFlightFail on a key owned elsewhere: %v, want an *InProgressError", err)
			}
			if ip.RetryAfter != 3*time.Second {
				t.Errorf("RetryAfter %v, want 3s", ip.RetryAfter)
			}
			if _, err := bFail.Do(ctx, "k", []byte("other"), other); !errors.Is(err, idemcore.ErrFingerprintMismatch) {
				t.Errorf("another fingerprint while owned elsewhere: %v", err)
			}

			waited := make(chan error, 1)
			var res idemcore.Result
			go func() {
				var err error
				res, err = bWait.Do(ctx, "k", []byte("fp"), other)
				waited <- err
			}()
			close(release)
			if err := <-aDone; err != nil {
				t.Fatal(err)
			}
			if err := <-waited; err != nil {
				t.Fatal(err)
			}
			if string(res.Response) != "A" || !res.Replayed || runs.Load() != 0 {
				t.Fatalf("the waiter got %q replayed=%v, other fn ran %d times; want A's answer", res.Response, res.Replayed, runs.Load())
			}
		})
	}
}

// TestTakeoverFencesStalledOwner: once A's lease has lapsed by the
// database's clock, B takes the key over (attempt 2, Recovered), and A's
// late completion is refused with ErrFenced: B's record stands.
func TestTakeoverFencesStalledOwner(t *testing.T) {
	st := newStore(t, pgtest.Env)
	// A renews rarely, so that its completion comes before it notices.
	a := st.openWith(t, idempg.Options{Lease: 10 * time.Second, Heartbeat: 9 * time.Second}, 0, nil)
	b := st.openWith(t, idempg.Options{Lease: 10 * time.Second}, 11*time.Second, nil)
	ctx := context.Background()
	started, release := make(chan context.Context, 1), make(chan struct{})
	aDone := make(chan error, 1)
	go func() {
		_, err := a.Do(ctx, "k", []byte("fp"), blocking("A", started, release))
		aDone <- err
	}()
	<-started

	var call idemcore.Call
	res, err := b.Do(ctx, "k", []byte("fp"), func(ctx context.Context) ([]byte, error) {
		call, _ = idemcore.CallFrom(ctx)
		return []byte("B"), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if string(res.Response) != "B" || res.Attempt != 2 || !call.Recovered || call.Attempt != 2 {
		t.Fatalf("takeover: %+v, call %+v; want B's answer, attempt 2, recovered", res, call)
	}
	close(release)
	if err := <-aDone; !errors.Is(err, idemcore.ErrFenced) || !errors.Is(err, idempg.ErrFenced) {
		t.Fatalf("the stalled owner's completion: %v, want ErrFenced", err)
	}
	rec, err := a.Get("k")
	if err != nil || string(rec.Response) != "B" || rec.Attempt != 2 {
		t.Fatalf("record after the refused completion: %+v, %v; want B's", rec, err)
	}
}

// TestLeaseLostCancelsFn: when A's renewal fails because another owner
// took the key over, A's fn's context is cancelled with cause ErrLeaseLost.
func TestLeaseLostCancelsFn(t *testing.T) {
	st := newStore(t, pgtest.Env)
	a := st.openWith(t, idempg.Options{Lease: 2 * time.Second}, 0, nil)
	b := st.openWith(t, idempg.Options{Lease: 2 * time.Second}, 3*time.Second, nil)
	ctx := context.Background()
	cause := make(chan error, 1)
	aDone := make(chan error, 1)
	started := make(chan struct{})
	go func() {
		_, err := a.Do(ctx, "k", nil, func(ctx context.Context) ([]byte, error) {
			close(started)
			<-ctx.Done() // a heartbeat after the takeover ends it
			cause <- context.Cause(ctx)
			return nil, ctx.Err()
		})
		aDone <- err
	}()
	<-started
	if _, err := b.Do(ctx, "k", nil, func(context.Context) ([]byte, error) { return []byte("B"), nil }); err != nil {
		t.Fatal(err)
	}
	if c := <-cause; !errors.Is(c, idemcore.ErrLeaseLost) || !errors.Is(c, idempg.ErrLeaseLost) {
		t.Fatalf("fn's context ended with cause %v, want ErrLeaseLost", c)
	}
	if err := <-aDone; err == nil {
		t.Fatal("A's Do after its lease was lost: no error")
	}
	rec, err := b.Get("k")
	if err != nil || string(rec.Response) != "B" {
		t.Fatalf("record: %+v, %v; want B's", rec, err)
	}
}

// TestDoTxHoldsKeyAgainstOtherProcesses: while a DoTx transaction holds a
// new key (its uncommitted started row), another engine's claim waits at
// most its lock_timeout and then sees the key as owned elsewhere, for Do and
// DoTx alike; fn ran once.
func TestDoTxHoldsKeyAgainstOtherProcesses(t *testing.T) {
	st := newStore(t, pgtest.Env)
	a := st.open(t, nil)
	b := st.openWith(t, idempg.Options{LockTimeout: 50 * time.Millisecond}, 0, &idemcore.Options{InFlight: idemcore.InFlightFail})
	ctx := context.Background()
	started, release := make(chan struct{}), make(chan struct{})
	aDone := make(chan error, 1)
	go func() {
		_, err := a.DoTx(ctx, "k", nil, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			var lt, idle string
			if err := tx.QueryRow(ctx, "SELECT current_setting('lock_timeout'), current_setting('idle_in_transaction_session_timeout')").Scan(&lt, &idle); err != nil {
				return nil, err
			}
			if lt != "5s" || idle != "2s" {
				t.Errorf("in DoTx: lock_timeout %q, idle_in_transaction_session_timeout %q; want 5s and the lease, 2s", lt, idle)
			}
			close(started)
			<-release
			return []byte("A"), nil
		})
		aDone <- err
	}()
	<-started
	_, err := b.Do(ctx, "k", nil, func(context.Context) ([]byte, error) { return []byte("B"), nil })
	if !errors.Is(err, idemcore.ErrInProgress) {
		t.Fatalf("claim of a key a DoTx transaction holds: %v, want ErrInProgress", err)
	}
	// DoTx's claim inside its own transaction meets the same row lock: the
	// key is owned elsewhere, not free, so it fails fast as well (bounded:
	// an engine that took it for free would try again until ctx ends).
	tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = b.DoTx(tctx, "k", nil, func(context.Context, pgx.Tx) ([]byte, error) { return []byte("B"), nil })
	var ip *idemcore.InProgressError
	if !errors.As(err, &ip) || !ip.StartedAt.IsZero() {
		t.Fatalf("DoTx of a key a DoTx transaction holds: %v, want an InProgressError with no start time (none is visible)", err)
	}
	close(release)
	if err := <-aDone; err != nil {
		t.Fatal(err)
	}
	res, err := b.Do(ctx, "k", nil, func(context.Context) ([]byte, error) { return []byte("B"), nil })
	if err != nil || string(res.Response) != "A" || !res.Replayed {
		t.Fatalf("after A's commit: %+v, %v; want A's answer replayed", res, err)
	}
}
