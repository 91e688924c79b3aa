package idempg_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idempg"
	"github.com/idemkit/idem/idempg/internal/pgtest"
)

// TestNotifyOnlyWaitedRecords: a completion notifies the key's waiters in
// other processes only when one waits on it (its mark on the row): with
// none, no notification is sent at all (Postgres serialises the commits of
// notifying transactions); with one, its notification wakes it, so that a
// waiter whose poll period is an hour still answers as soon as the owner
// completes.
func TestNotifyOnlyWaitedRecords(t *testing.T) {
	st := newStore(t, pgtest.Env)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	channel := "idem_" + st.opts.Schema
	conn, err := pgx.Connect(ctx, pgtest.DSN(t, pgtest.Env))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	// next returns the payload of the next notification on the channel,
	// after a sentinel sent now: everything notified before the sentinel.
	before := func() []string {
		t.Helper()
		if _, err := st.pool.Exec(ctx, "SELECT pg_notify($1, 'sentinel')", channel); err != nil {
			t.Fatal(err)
		}
		var got []string
		for {
			n, err := conn.WaitForNotification(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if n.Payload == "sentinel" {
				return got
			}
			got = append(got, n.Payload)
		}
	}

	a := st.open(t, nil)
	if _, err := a.Do(ctx, "quiet", nil, func(context.Context) ([]byte, error) { return []byte("A"), nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := a.DoTx(ctx, "quiet-tx", nil, func(context.Context, pgx.Tx) ([]byte, error) { return []byte("A"), nil }); err != nil {
		t.Fatal(err)
	}
	if got := before(); len(got) != 0 {
		t.Fatalf("completions nobody waited on notified %q, want nothing", got)
	}

	// A waiter in another engine (as another process would be), which
	// polls once an hour: only the notification can wake it in time.
	b := st.openWith(t, idempg.Options{PollInterval: time.Hour}, 0, nil)
	started, release := make(chan context.Context, 1), make(chan struct{})
	aDone := make(chan error, 1)
	go func() {
		_, err := a.Do(ctx, "waited", nil, blocking("A", started, release))
		aDone <- err
	}()
	<-started
	type answer struct {
		resp     string
		replayed bool
		err      error
	}
	bDone := make(chan answer, 1)
	go func() {
		res, err := b.Do(ctx, "waited", nil, func(context.Context) ([]byte, error) { return []byte("B"), nil })
		bDone <- answer{string(res.Response), res.Replayed, err}
	}()
	// Wait for the event: B marked the row as waited on.
	for {
		var marked bool
		if err := st.pool.QueryRow(ctx, "SELECT waiters FROM "+st.opts.Schema+".idem_records WHERE key = 'waited'").Scan(&marked); err != nil {
			t.Fatal(err)
		}
		if marked {
			break
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	if err := <-aDone; err != nil {
		t.Fatal(err)
	}
	got := <-bDone
	if got.err != nil || got.resp != "A" || !got.replayed {
		t.Fatalf("the waiter: %+v; want A's answer, replayed, woken by the notification (its poll period is an hour)", got)
	}
	if n := before(); len(n) != 1 || n[0] != "waited" {
		t.Fatalf("notified %q, want the waited key once", n)
	}
}

// TestOutboxNotifiesPerTransaction: a DoTx call that enqueues wakes the
// dispatchers of other processes with one notification on the outbox
// channel at its commit, also when the first message it enqueued was
// rolled back with a savepoint of fn's own; a call that enqueues nothing
// sends none.
func TestOutboxNotifiesPerTransaction(t *testing.T) {
	st := newStore(t, pgtest.Env)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	channel := "idem_" + st.opts.Schema + "_outbox"
	conn, err := pgx.Connect(ctx, pgtest.DSN(t, pgtest.Env))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	notified := func() int {
		t.Helper()
		if _, err := st.pool.Exec(ctx, "SELECT pg_notify($1, 'sentinel')", channel); err != nil {
			t.Fatal(err)
		}
		n := 0
		for {
			m, err := conn.WaitForNotification(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if m.Payload == "sentinel" {
				return n
			}
			n++
		}
	}
	a := st.open(t, nil)
	if _, err := a.DoTx(ctx, "none", nil, func(context.Context, pgx.Tx) ([]byte, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	if n := notified(); n != 0 {
		t.Errorf("a call that enqueued nothing: %d outbox notifications, want none", n)
	}
	if _, err := a.DoTx(ctx, "some", nil, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		sp, err := tx.Begin(ctx)
		if err != nil {
			return nil, err
		}
		if err := idempg.Enqueue(tx, "t", []byte("rolled back")); err != nil {
			return nil, err
		}
		if err := sp.Rollback(ctx); err != nil {
			return nil, err
		}
		for _, p := range []string{"one", "two", "three"} {
			if err := idempg.Enqueue(tx, "t", []byte(p)); err != nil {
				return nil, err
			}
		}
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	if n := notified(); n != 1 {
		t.Errorf("a call that enqueued (its first message rolled back): %d outbox notifications, want one", n)
	}
}
