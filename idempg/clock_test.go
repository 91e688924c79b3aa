package idempg_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idempg"
	"github.com/idemkit/idem/idempg/internal/pgtest"
)

// Issue 18 item 3: one host with a skewed clock must not void dedupe for
// the others. Every test here opens two engines on one schema (two
// processes' worth), one of them with an Options.Now that runs ahead of or
// behind this machine's clock (and the database's), and checks that every
// judgement by time (retention, liveness, pruning, the outbox's due times
// and dead-letter retention) is the database clock's.

// skewed is a clock d away from this machine's (and the database's).
func skewed(d time.Duration) func() time.Time { return func() time.Time { return time.Now().Add(d) } }

// skews are the skews past a window that today void it: a day and an hour
// with the default window, an hour and a minute with a window of an hour.
var skews = []struct {
	name      string
	skew      time.Duration
	retention time.Duration
}{
	{"25h, default retention", 25 * time.Hour, 0},
	{"61m, Retention 1h", 61 * time.Minute, time.Hour},
}

// dbNow is the database's clock.
func dbNow(t *testing.T, st *store) time.Time {
	t.Helper()
	var now time.Time
	if err := st.pool.QueryRow(context.Background(), "SELECT now()").Scan(&now); err != nil {
		t.Fatal(err)
	}
	return now
}

// near fails unless at is within a minute of the database's clock: a time
// the database stamped, not a skewed engine.
func near(t *testing.T, st *store, what string, at time.Time) {
	t.Helper()
	if d := at.Sub(dbNow(t, st)).Abs(); d > time.Minute {
		t.Errorf("%s is %v, %v away from the database's clock", what, at, d)
	}
}

// mustNotRun is an fn that fails the test if it runs.
func mustNotRun(t *testing.T, what string) func(context.Context) ([]byte, error) {
	return func(ctx context.Context) ([]byte, error) {
		c, _ := idemcore.CallFrom(ctx)
		t.Errorf("%s: fn ran (%+v), want a replay", what, c)
		return []byte("ran again"), nil
	}
}

// bounded is a context that ends a call that would otherwise spin or hang
// (a bound on a hang, not a timing claim).
func bounded(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestSkewedClockAhead: an engine whose clock runs past the others'
// windows replays their seconds-old done records (Do, DoTx, Get, Records),
// refuses a key whose owner still runs, prunes nothing live, forgets and
// resolves live records as live ones.
func TestSkewedClockAhead(t *testing.T) {
	for _, env := range []string{pgtest.Env, pgtest.BouncerEnv} {
		for _, c := range skews {
			t.Run(env+"/"+c.name, func(t *testing.T) {
				st := newStore(t, env)
				a := st.open(t, &idemcore.Options{Retention: c.retention})
				b := st.open(t, &idemcore.Options{Retention: c.retention, Now: skewed(c.skew)})
				bFail := st.open(t, &idemcore.Options{Retention: c.retention, Now: skewed(c.skew), InFlight: idemcore.InFlightFail})
				ctx := bounded(t)
				fp := []byte("fp")

				if _, err := a.Do(ctx, "done", fp, func(context.Context) ([]byte, error) { return []byte("A"), nil }); err != nil {
					t.Fatal(err)
				}
				res, err := b.Do(ctx, "done", fp, mustNotRun(t, "Do"))
				if err != nil || !res.Replayed || string(res.Response) != "A" {
					t.Errorf("the skewed engine's Do of a done key: %+v, %v; want A's answer replayed", res, err)
				}
				res, err = b.DoTx(ctx, "done", fp, func(ctx context.Context, _ pgx.Tx) ([]byte, error) { return mustNotRun(t, "DoTx")(ctx) })
				if err != nil || !res.Replayed || string(res.Response) != "A" {
					t.Errorf("the skewed engine's DoTx of a done key: %+v, %v; want A's answer replayed", res, err)
				}
				if r, err := b.Get("done"); err != nil || string(r.Response) != "A" {
					t.Errorf("the skewed engine's Get: %+v, %v; want A's record", r, err)
				}
				if keys := recordKeys(t, b); len(keys) != 1 || keys[0] != "done" {
					t.Errorf("the skewed engine's Records: %v, want [done]", keys)
				}

				// A key whose owner still runs is in progress, not expired.
				started, release, free := gate(t)
				aDone := make(chan error, 1)
				go func() {
					_, err := a.Do(context.Background(), "running", fp, blocking("A", started, release))
					aDone <- err
				}()
				<-started
				_, err = bFail.Do(ctx, "running", fp, mustNotRun(t, "Do of a running key"))
				var ip *idemcore.InProgressError
				if !errors.As(err, &ip) {
					t.Errorf("the skewed engine's Do of a key whose owner runs: %v, want an *InProgressError", err)
				}
				free()
				if err := <-aDone; err != nil {
					t.Fatalf("the owner's call: %v", err)
				}

				// Prune deletes nothing live.
				if n, err := b.Prune(ctx); err != nil || n != 0 {
					t.Errorf("the skewed engine's Prune: %d, %v; want nothing pruned", n, err)
				}
				if res, err := a.Do(ctx, "done", fp, mustNotRun(t, "Do after the skewed Prune")); err != nil || !res.Replayed {
					t.Errorf("after the skewed engine's Prune: %+v, %v; want a replay", res, err)
				}

				// An orphan of A's (its lease ended at once) is resolved, not
				// absent; a live record is forgotten as found.
				func() {
					defer func() { _ = recover() }()
					_, _ = a.Do(ctx, "orphan", fp, func(context.Context) ([]byte, error) { panic("interrupted") })
				}()
				if err := b.Resolve("orphan", []byte("by hand"), nil); err != nil {
					t.Errorf("the skewed engine's Resolve of a fresh interrupted execution: %v", err)
				}
				if err := b.Forget("done"); err != nil {
					t.Errorf("the skewed engine's Forget of a live record: %v, want it found", err)
				}
			})
		}
	}
}

// TestSkewedClockBehind: what an engine whose clock runs behind writes lives
// its whole window for the others: its done records (Do, DoTx, Resolve)
// are replayed and never pruned, its started record is owned while its fn
// runs, and every time it stores is the database's.
func TestSkewedClockBehind(t *testing.T) {
	for _, env := range []string{pgtest.Env, pgtest.BouncerEnv} {
		for _, c := range skews {
			t.Run(env+"/"+c.name, func(t *testing.T) {
				st := newStore(t, env)
				a := st.open(t, &idemcore.Options{Retention: c.retention})
				aFail := st.open(t, &idemcore.Options{Retention: c.retention, InFlight: idemcore.InFlightFail})
				b := st.open(t, &idemcore.Options{Retention: c.retention, Now: skewed(-c.skew)})
				ctx := bounded(t)
				fp := []byte("fp")

				res, err := b.Do(ctx, "do", fp, func(context.Context) ([]byte, error) { return []byte("B"), nil })
				if err != nil {
					t.Fatal(err)
				}
				near(t, st, "the skewed engine's StartedAt", res.StartedAt)
				near(t, st, "the skewed engine's CompletedAt", res.CompletedAt)
				if _, err := b.DoTx(ctx, "dotx", fp, func(context.Context, pgx.Tx) ([]byte, error) { return []byte("B"), nil }); err != nil {
					t.Fatal(err)
				}
				func() {
					defer func() { _ = recover() }()
					_, _ = b.Do(ctx, "resolved", fp, func(context.Context) ([]byte, error) { panic("interrupted") })
				}()
				if err := b.Resolve("resolved", []byte("B"), nil); err != nil {
					t.Fatal(err)
				}
				for _, key := range []string{"do", "dotx", "resolved"} {
					res, err := a.Do(ctx, key, fp, mustNotRun(t, "Do of "+key))
					if err != nil || !res.Replayed || string(res.Response) != "B" {
						t.Errorf("%s written by the skewed engine: %+v, %v; want B's answer replayed", key, res, err)
					}
					r, err := a.Get(key)
					if err != nil {
						t.Errorf("Get %s: %v", key, err)
						continue
					}
					near(t, st, key+"'s StartedAt", r.StartedAt)
					near(t, st, key+"'s CompletedAt", r.CompletedAt)
				}
				if n, err := a.Prune(ctx); err != nil || n != 0 {
					t.Errorf("Prune: %d, %v; want none of the skewed engine's records pruned", n, err)
				}

				// The skewed engine's running call owns its key.
				started, release, free := gate(t)
				bDone := make(chan error, 1)
				go func() {
					_, err := b.Do(context.Background(), "running", fp, blocking("B", started, release))
					bDone <- err
				}()
				<-started
				_, err = aFail.Do(ctx, "running", fp, mustNotRun(t, "Do of a running key"))
				var ip *idemcore.InProgressError
				if !errors.As(err, &ip) {
					t.Errorf("Do of a key the skewed engine runs: %v, want an *InProgressError", err)
				}
				free()
				if err := <-bDone; err != nil {
					t.Fatalf("the skewed engine's call: %v", err)
				}
			})
		}
	}
}

// recordKeys lists e's live records.
func recordKeys(t *testing.T, e *idempg.Engine) []string {
	t.Helper()
	var keys []string
	if err := e.Records(func(r *idemcore.Record, err error) error {
		if err != nil {
			return err
		}
		keys = append(keys, r.Key)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return keys
}

// TestSkewedClockOutbox: the outbox's times are the database's: a skewed
// dispatcher's backoff (NextAttemptAt) and dead letters (DeadAt) are
// stamped by the database's clock; a dispatcher running ahead claims no
// message before its next attempt; dead letters live their retention for an
// engine running ahead (Messages, RetryDead, Prune); messages' EnqueuedAt
// is the database's.
func TestSkewedClockOutbox(t *testing.T) {
	const hour = time.Hour
	type delivery struct {
		payload string
		attempt int
	}
	var (
		mu        sync.Mutex
		delivered []delivery
	)
	record := func(_ context.Context, m idemcore.Message) error {
		mu.Lock()
		defer mu.Unlock()
		delivered = append(delivered, delivery{string(m.Payload), m.Attempt})
		return nil
	}
	failing := func(context.Context, idemcore.Message) error { return errors.New("down") }
	// dispatching are engine options that deliver topic t with h.
	dispatching := func(now func() time.Time, h idemcore.Handler, maxAttempts int) *idemcore.Options {
		return &idemcore.Options{Now: now, Outbox: idemcore.OutboxOptions{Dispatch: true, Handlers: map[string]idemcore.Handler{"t": h},
			BaseBackoff: hour, MaxBackoff: hour, MaxAttempts: maxAttempts, PollInterval: 10 * time.Millisecond}}
	}
	enqueue := func(t *testing.T, e *idempg.Engine, key string) {
		t.Helper()
		if _, err := e.DoTx(context.Background(), key, nil, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			return nil, idempg.Enqueue(tx, "t", []byte(key))
		}); err != nil {
			t.Fatal(err)
		}
	}
	// messages lists e's messages by payload.
	messages := func(t *testing.T, e *idempg.Engine) map[string]*idemcore.Message {
		t.Helper()
		ms := map[string]*idemcore.Message{}
		if err := e.Messages(func(m *idemcore.Message, err error) error {
			if err == nil {
				ms[string(m.Payload)] = m
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return ms
	}
	// await polls e's messages until cond holds (a bound on a hang, not a
	// timing claim).
	await := func(t *testing.T, e *idempg.Engine, what string, cond func(map[string]*idemcore.Message) bool) map[string]*idemcore.Message {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			ms := messages(t, e)
			if cond(ms) {
				return ms
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: never; messages %v", what, ms)
			}
			time.Sleep(10 * time.Millisecond) // polls a state the dispatcher reaches; no timing claim
		}
	}
	failedOnce := func(key string) func(map[string]*idemcore.Message) bool {
		return func(ms map[string]*idemcore.Message) bool { m := ms[key]; return m != nil && m.Failures == 1 }
	}
	deadOne := func(key string) func(map[string]*idemcore.Message) bool {
		return func(ms map[string]*idemcore.Message) bool { m := ms[key]; return m != nil && m.Dead }
	}

	for _, skew := range []time.Duration{25 * hour, -25 * hour} {
		t.Run(fmt.Sprintf("a failed attempt's backoff, skew %v", skew), func(t *testing.T) {
			st := newStore(t, pgtest.Env)
			a := st.open(t, nil)
			st.open(t, dispatching(skewed(skew), failing, 0)) // the skewed dispatcher
			enqueue(t, a, "m")
			near(t, st, "EnqueuedAt", messages(t, a)["m"].EnqueuedAt)
			m := await(t, a, "a failed attempt", failedOnce("m"))["m"]
			// BaseBackoff = MaxBackoff = 1h, jittered into [30m, 1h).
			if left := m.NextAttemptAt.Sub(dbNow(t, st)); left < 29*time.Minute || left > hour {
				t.Errorf("the skewed dispatcher's next attempt is %v from the database's now, want 30m to 1h", left)
			}
		})
	}

	t.Run("a dispatcher running ahead claims nothing before its next attempt", func(t *testing.T) {
		st := newStore(t, pgtest.Env)
		a := st.open(t, dispatching(nil, failing, 0))
		enqueue(t, a, "backing-off")
		await(t, a, "a failed attempt", failedOnce("backing-off"))
		_ = a.Close()
		b := st.open(t, dispatching(skewed(25*hour), record, 0))
		// A due message of another ordering key: once it is delivered, the
		// skewed dispatcher has claimed the due heads at least once.
		enqueue(t, b, "due")
		await(t, b, "the due message delivered", func(ms map[string]*idemcore.Message) bool { return ms["due"] == nil })
		mu.Lock()
		got := delivered
		delivered = nil
		mu.Unlock()
		if len(got) != 1 || got[0].payload != "due" {
			t.Errorf("the skewed dispatcher delivered %v, want only the due message", got)
		}
	})

	t.Run("a dead letter of an engine running behind is stamped by the database", func(t *testing.T) {
		st := newStore(t, pgtest.Env)
		a := st.open(t, nil)
		b := st.open(t, dispatching(skewed(-8*24*hour), failing, 1))
		enqueue(t, b, "dead")
		near(t, st, "EnqueuedAt", messages(t, a)["dead"].EnqueuedAt)
		m := await(t, a, "a dead letter", deadOne("dead"))["dead"]
		near(t, st, "DeadAt", m.DeadAt)
		if _, err := a.Prune(context.Background()); err != nil {
			t.Fatal(err)
		}
		if messages(t, a)["dead"] == nil {
			t.Error("a dead letter of the skewed engine's was pruned inside its retention")
		}
	})

	t.Run("a dead letter lives its retention for an engine running ahead", func(t *testing.T) {
		st := newStore(t, pgtest.Env)
		a := st.open(t, dispatching(nil, failing, 1))
		enqueue(t, a, "dead")
		await(t, a, "a dead letter", deadOne("dead"))
		_ = a.Close()
		b := st.open(t, &idemcore.Options{Now: skewed(8 * 24 * hour)}) // past the default 7 days
		m := messages(t, b)["dead"]
		if m == nil {
			t.Fatal("the skewed engine's Messages hides a fresh dead letter")
		}
		if _, err := b.Prune(context.Background()); err != nil {
			t.Fatal(err)
		}
		if messages(t, b)["dead"] == nil {
			t.Fatal("the skewed engine's Prune deleted a fresh dead letter")
		}
		if err := b.RetryDead(m.Seq); err != nil {
			t.Errorf("the skewed engine's RetryDead of a fresh dead letter: %v", err)
		}
	})
}
