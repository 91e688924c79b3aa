package idem_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit"
	"github.com/idemkit/idem/internal/testkit/boltkit"
)

// eventRecorder is an Observer that keeps every event.
type eventRecorder struct {
	mu     sync.Mutex
	events []idem.Event
}

func (r *eventRecorder) Observe(ev idem.Event) {
	r.mu.Lock()
	r.events = append(r.events, ev)
	r.mu.Unlock()
}

// of returns the events of kind.
func (r *eventRecorder) of(kind idem.EventKind) []idem.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []idem.Event
	for _, ev := range r.events {
		if ev.Kind == kind {
			out = append(out, ev)
		}
	}
	return out
}

func (r *eventRecorder) all() []idem.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]idem.Event(nil), r.events...)
}

func TestObserverCalls(t *testing.T) {
	rec := &eventRecorder{}
	clock := testkit.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	e, _ := boltkit.OpenFile(t, &idem.BoltOptions{NoSync: true}, &idem.Options{Now: clock.Now, PruneInterval: -1, Observer: rec})
	bg := context.Background()
	secret := "customer-4111111111111111"
	resp := []byte("response-with-pii")
	ok := func(context.Context) ([]byte, error) { return resp, nil }

	_, err := e.Do(bg, secret, []byte("a"), ok)
	require.NoError(t, err)
	require.Equal(t, []idem.Event{{Kind: idem.EventExecution, Op: "do", N: 1}}, rec.of(idem.EventExecution))
	commits := rec.of(idem.EventCommit)
	require.Len(t, commits, 2, "started and done")
	for _, c := range commits {
		require.Equal(t, 1, c.N)
		require.Positive(t, c.Duration)
	}

	res, err := e.Do(bg, secret, []byte("a"), ok)
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.Equal(t, []idem.Event{{Kind: idem.EventReplay, Op: "do"}}, rec.of(idem.EventReplay))

	_, err = e.Do(bg, secret, []byte("b"), ok)
	require.ErrorIs(t, err, idem.ErrFingerprintMismatch)
	require.Equal(t, []idem.Event{{Kind: idem.EventConflict, Op: "do"}}, rec.of(idem.EventConflict))

	_, err = e.DoTx(bg, "tx-key", nil, func(context.Context, *idem.Tx) ([]byte, error) { return nil, nil })
	require.NoError(t, err)
	require.Equal(t, idem.Event{Kind: idem.EventExecution, Op: "dotx", N: 1}, rec.of(idem.EventExecution)[1])

	// A recovered interrupted execution reports its attempt.
	func() {
		defer func() { _ = recover() }()
		_, _ = e.Do(bg, "crash", nil, func(context.Context) ([]byte, error) { panic("crash") })
	}()
	_, err = e.Do(bg, "crash", nil, ok)
	require.NoError(t, err)
	require.Equal(t, idem.Event{Kind: idem.EventExecution, Op: "do", N: 2}, rec.of(idem.EventExecution)[3])

	clock.Advance(2 * idem.DefaultRetention)
	n, err := e.Prune(bg)
	require.NoError(t, err)
	require.Positive(t, n)
	prunes := rec.of(idem.EventPrune)
	require.Len(t, prunes, 1)
	require.Equal(t, n, prunes[0].N)

	for _, ev := range rec.all() {
		for _, s := range []string{ev.Op, ev.Topic, ev.Kind.String()} {
			require.NotContains(t, s, "4111", "no key in an event")
			require.NotContains(t, s, "pii", "no response in an event")
		}
	}
}

func TestObserverDuplicates(t *testing.T) {
	for _, policy := range []idem.InFlightPolicy{idem.InFlightWait, idem.InFlightFail} {
		rec := &eventRecorder{}
		e, _ := boltkit.OpenFile(t, &idem.BoltOptions{NoSync: true}, &idem.Options{InFlight: policy, Observer: rec})
		running, release := make(chan struct{}), make(chan struct{})
		done := make(chan error, 1)
		go func() {
			_, err := e.Do(context.Background(), "k", nil, func(context.Context) ([]byte, error) {
				close(running)
				<-release
				return []byte("ok"), nil
			})
			done <- err
		}()
		<-running
		dup := make(chan error, 1)
		go func() {
			_, err := e.Do(context.Background(), "k", nil, func(context.Context) ([]byte, error) { return nil, nil })
			dup <- err
		}()
		if policy == idem.InFlightFail {
			require.ErrorIs(t, <-dup, idem.ErrInProgress)
			require.Equal(t, []idem.Event{{Kind: idem.EventInProgress, Op: "do"}}, rec.of(idem.EventInProgress))
			close(release)
		} else {
			deadline := time.Now().Add(10 * time.Second)
			for len(rec.of(idem.EventWait)) == 0 {
				require.False(t, time.Now().After(deadline), "the duplicate never waited")
				time.Sleep(time.Millisecond)
			}
			close(release)
			require.NoError(t, <-dup)
			require.Equal(t, []idem.Event{{Kind: idem.EventWait, Op: "do"}}, rec.of(idem.EventWait))
		}
		require.NoError(t, <-done)
		require.Len(t, rec.of(idem.EventExecution), 1)
	}
}

func TestObserverOutbox(t *testing.T) {
	rec := &eventRecorder{}
	e, _ := boltkit.OpenFile(t, &idem.BoltOptions{NoSync: true}, &idem.Options{PruneInterval: -1, Observer: rec, Outbox: idem.OutboxOptions{
		Dispatch: true, PollInterval: time.Millisecond, MaxAttempts: 2, BaseBackoff: time.Nanosecond,
		Handlers: map[string]idem.Handler{
			"email":  func(context.Context, idem.Message) error { return nil },
			"charge": func(context.Context, idem.Message) error { return errors.New("declined for order-secret") },
		},
	}})
	_, err := e.DoTx(context.Background(), "order-secret", nil, func(_ context.Context, tx *idem.Tx) ([]byte, error) {
		if err := tx.Enqueue("email", []byte("payload-secret")); err != nil {
			return nil, err
		}
		return nil, tx.Enqueue("charge", []byte("payload-secret"))
	})
	require.NoError(t, err)
	deadline := time.Now().Add(10 * time.Second)
	for len(rec.of(idem.EventDeadLetter)) == 0 || len(rec.of(idem.EventDelivery)) == 0 {
		require.False(t, time.Now().After(deadline), "no delivery and dead letter: %v", rec.all())
		time.Sleep(time.Millisecond)
	}
	require.Equal(t, []idem.Event{{Kind: idem.EventDelivery, Topic: "email"}}, rec.of(idem.EventDelivery))
	require.Equal(t, []idem.Event{
		{Kind: idem.EventDeliveryFailed, Topic: "charge", N: 1},
		{Kind: idem.EventDeliveryFailed, Topic: "charge", N: 2},
	}, rec.of(idem.EventDeliveryFailed))
	require.Equal(t, []idem.Event{{Kind: idem.EventDeadLetter, Topic: "charge"}}, rec.of(idem.EventDeadLetter))
	for _, ev := range rec.all() {
		require.NotContains(t, ev.Op+ev.Topic, "secret")
	}
}

func TestEventKindString(t *testing.T) {
	require.Equal(t, "in_progress", idem.EventInProgress.String())
	require.Equal(t, "dead_letter", idem.EventDeadLetter.String())
	require.Equal(t, "EventKind(0)", idem.EventKind(0).String())
	require.Equal(t, "EventKind(200)", idem.EventKind(200).String())
	for k := idem.EventExecution; k <= idem.EventDeadLetter; k++ {
		require.False(t, strings.HasPrefix(k.String(), "EventKind"), "kind %d has a name", k)
	}
}
