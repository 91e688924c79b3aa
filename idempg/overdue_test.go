package idempg_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idempg"
	"github.com/idemkit/idem/idempg/internal/pgtest"
)

// TestLiveLeasePastRetention: a call of another engine that runs longer
// than its retention window, its lease renewed, still holds its key: a
// duplicate elsewhere fails fast with InFlightFail (an *InProgressError)
// or waits for its outcome (InFlightWait), never runs fn, and does not spin on a claim that answers a row the engine
// judges absent.
func TestLiveLeasePastRetention(t *testing.T) {
	st := newStore(t, pgtest.Env)
	var shift atomic.Int64
	clock := func() time.Time { return time.Now().Add(time.Duration(shift.Load())) }
	oa, ob := st.opts, st.opts
	idempg.SetClock(&oa, clock)
	idempg.SetClock(&ob, clock)
	a := st.openWith(t, oa, 0, &idemcore.Options{Retention: time.Minute})
	b := st.openWith(t, ob, 0, &idemcore.Options{Retention: time.Minute, InFlight: idemcore.InFlightFail})
	oc := st.opts
	idempg.SetClock(&oc, clock)
	waiting := make(chan struct{}, 1)
	w := st.openWith(t, oc, 0, &idemcore.Options{Retention: time.Minute, Observer: waitSignal(waiting)})
	ctx := context.Background()
	started, release := make(chan context.Context, 1), make(chan struct{})
	aDone := make(chan error, 1)
	go func() {
		_, err := a.Do(ctx, "k", nil, blocking("A", started, release))
		aDone <- err
	}()
	<-started
	shift.Add(int64(2 * time.Minute)) // the records' clock past the window; the lease's is not moved
	bctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := b.Do(bctx, "k", nil, func(context.Context) ([]byte, error) {
		t.Error("fn ran while another engine's live lease holds the key")
		return []byte("B"), nil
	})
	var ip *idemcore.InProgressError
	if !errors.As(err, &ip) {
		t.Errorf("duplicate of a call running past its retention, its lease live: %v; want an InProgressError", err)
	}
	// A waiter (InFlightWait) waits for A's outcome and shares it.
	wDone := make(chan struct{})
	go func() {
		defer close(wDone)
		res, err := w.Do(bctx, "k", nil, func(context.Context) ([]byte, error) {
			t.Error("the waiter's fn ran while another engine's live lease holds the key")
			return []byte("W"), nil
		})
		if err != nil || string(res.Response) != "A" {
			t.Errorf("waiter on a call running past its retention: %+v, %v; want A's answer", res, err)
		}
	}()
	<-waiting // it waits on the key, the call still running
	close(release)
	if err := <-aDone; err != nil {
		t.Fatal(err)
	}
	<-wDone
}

// waitSignal is an Observer that signals ch (without blocking) on each
// EventWait.
type waitSignal chan struct{}

func (w waitSignal) Observe(ev idemcore.Event) {
	if ev.Kind == idemcore.EventWait {
		select {
		case w <- struct{}{}:
		default:
		}
	}
}
