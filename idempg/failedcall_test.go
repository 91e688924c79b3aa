package idempg_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idempg"
	"github.com/idemkit/idem/idempg/internal/pgtest"
)

// TestFailedCallCarriesNoResponse: a call whose fn ran but whose outcome
// was not stored (its completion fenced off by another owner's takeover,
// or its transaction aborted by a statement error fn swallowed) returns an
// error and no Result.Response: fn's bytes are no answer of the key's.
func TestFailedCallCarriesNoResponse(t *testing.T) {
	ctx := context.Background()
	// stalled runs fn on engine a (which renews rarely) until b (whose
	// clock is past a's lease) has taken key over and stored "B", then
	// returns a's answer.
	stalled := func(t *testing.T, st *store, a, b *idempg.Engine, run func(release <-chan struct{}, started chan<- struct{}) (idemcore.Result, error)) (idemcore.Result, error) {
		t.Helper()
		started, release := make(chan struct{}), make(chan struct{})
		type answer struct {
			res idemcore.Result
			err error
		}
		done := make(chan answer, 1)
		go func() {
			res, err := run(release, started)
			done <- answer{res, err}
		}()
		<-started
		res, err := b.Do(ctx, "k", []byte("fp"), func(context.Context) ([]byte, error) { return []byte("B"), nil })
		if err != nil || string(res.Response) != "B" || res.Attempt < 2 {
			t.Fatalf("takeover: %+v, %v", res, err)
		}
		close(release)
		a2 := <-done
		if rec, err := st.open(t, nil).Get("k"); err != nil || string(rec.Response) != "B" {
			t.Fatalf("record after the fenced call: %+v, %v; want B's", rec, err)
		}
		return a2.res, a2.err
	}
	lease := idempg.Options{Lease: 10 * time.Second, Heartbeat: 9 * time.Second}

	t.Run("Do: fenced by a takeover", func(t *testing.T) {
		st := newStore(t, pgtest.Env)
		a := st.openWith(t, lease, 0, nil)
		b := st.openWith(t, lease, 11*time.Second, nil)
		res, err := stalled(t, st, a, b, func(release <-chan struct{}, started chan<- struct{}) (idemcore.Result, error) {
			return a.Do(ctx, "k", []byte("fp"), func(context.Context) ([]byte, error) {
				close(started)
				<-release
				return []byte("A"), nil
			})
		})
		if !errors.Is(err, idemcore.ErrFenced) {
			t.Fatalf("the stalled owner's call: %v, want ErrFenced", err)
		}
		if res.Response != nil {
			t.Errorf("the fenced call returned the response %q, never stored", res.Response)
		}
	})

	t.Run("DoTx: fenced by a takeover while recovering", func(t *testing.T) {
		st := newStore(t, pgtest.Env)
		a := st.openWith(t, lease, 0, nil)
		b := st.openWith(t, lease, 11*time.Second, nil)
		func() {
			defer func() { _ = recover() }()
			_, _ = a.Do(ctx, "k", []byte("fp"), func(context.Context) ([]byte, error) { panic("interrupted") })
		}()
		res, err := stalled(t, st, a, b, func(release <-chan struct{}, started chan<- struct{}) (idemcore.Result, error) {
			return a.DoTx(ctx, "k", []byte("fp"), func(context.Context, pgx.Tx) ([]byte, error) {
				close(started)
				<-release
				return []byte("A"), nil
			})
		})
		if !errors.Is(err, idemcore.ErrFenced) {
			t.Fatalf("the stalled owner's DoTx: %v, want ErrFenced", err)
		}
		if res.Response != nil {
			t.Errorf("the fenced DoTx returned the response %q, never stored", res.Response)
		}
	})

	for _, env := range []string{pgtest.Env, pgtest.BouncerEnv} {
		t.Run("DoTx: a statement error fn swallowed/"+env, func(t *testing.T) {
			st := newStore(t, env)
			e := st.open(t, nil)
			res, err := e.DoTx(ctx, "k", []byte("fp"), func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
				_, _ = tx.Exec(ctx, "SELECT * FROM no_such_table") // aborts the transaction; fn carries on
				return []byte("booked"), nil
			})
			if err == nil {
				t.Fatal("DoTx committed a transaction a statement aborted")
			}
			if res.Response != nil {
				t.Errorf("the failed DoTx returned the response %q, never stored (%v)", res.Response, err)
			}
			if _, gerr := e.Get("k"); !errors.Is(gerr, idemcore.ErrNotFound) {
				t.Errorf("after the failed DoTx: %v, want no record", gerr)
			}
		})
	}
}
