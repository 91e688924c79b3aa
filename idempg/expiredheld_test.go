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

// TestExpiredRowRetakenByDoTx: a DoTx of one engine that re-claims an
// expired, unpruned record (its transaction replacing the row, not yet
// committed) holds the key against the others: Do and DoTx of an
// InFlightFail engine get ErrInProgress after lock_timeout, an
// InFlightWait engine's Do waits and shares the DoTx's answer, and no
// other fn runs; the old outcome is never replayed.
func TestExpiredRowRetakenByDoTx(t *testing.T) {
	for _, env := range []string{pgtest.Env, pgtest.BouncerEnv} {
		t.Run(env, func(t *testing.T) { testExpiredRowRetakenByDoTx(t, env) })
	}
}

func testExpiredRowRetakenByDoTx(t *testing.T, env string) {
	st := newStore(t, env)
	eo := func(f idemcore.InFlightPolicy, obs idemcore.Observer) *idemcore.Options {
		return &idemcore.Options{Retention: time.Minute, InFlight: f, Observer: obs}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a := st.open(t, eo(idemcore.InFlightWait, nil))
	if _, err := a.Do(ctx, "k", nil, func(context.Context) ([]byte, error) { return []byte("old"), nil }); err != nil {
		t.Fatal(err)
	}
	st.offset.Add(int64(2 * time.Minute))
	short := idempg.Options{LockTimeout: 50 * time.Millisecond}
	fail := st.openWith(t, short, 0, eo(idemcore.InFlightFail, nil))
	waiting := make(chan struct{}, 1)
	wait := st.openWith(t, short, 0, eo(idemcore.InFlightWait, waitSignal(waiting)))
	started, release := make(chan struct{}), make(chan struct{})
	aDone := make(chan error, 1)
	go func() {
		res, err := a.DoTx(ctx, "k", nil, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			close(started)
			<-release
			return []byte("A"), nil
		})
		if err == nil && (string(res.Response) != "A" || res.Replayed) {
			err = errors.New("DoTx of an expired key: answered " + string(res.Response))
		}
		aDone <- err
	}()
	<-started
	never := func(context.Context) ([]byte, error) {
		t.Error("fn ran while a DoTx transaction holds the key")
		return []byte("no"), nil
	}
	if _, err := fail.Do(ctx, "k", nil, never); !errors.Is(err, idemcore.ErrInProgress) {
		t.Errorf("Do of an expired key a DoTx transaction re-claimed: %v, want ErrInProgress", err)
	}
	if _, err := fail.DoTx(ctx, "k", nil, func(ctx context.Context, _ pgx.Tx) ([]byte, error) { return never(ctx) }); !errors.Is(err, idemcore.ErrInProgress) {
		t.Errorf("DoTx of an expired key a DoTx transaction re-claimed: %v, want ErrInProgress", err)
	}
	wDone := make(chan struct{})
	go func() {
		defer close(wDone)
		res, err := wait.Do(ctx, "k", nil, never)
		if err != nil || string(res.Response) != "A" || !res.Replayed {
			t.Errorf("waiter on an expired key a DoTx transaction re-claimed: %+v, %v; want A's answer replayed", res, err)
		}
	}()
	<-waiting
	close(release)
	if err := <-aDone; err != nil {
		t.Fatal(err)
	}
	<-wDone
}
