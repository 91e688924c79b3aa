package idempg_test

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idempg"
	"github.com/idemkit/idem/idempg/internal/pgtest"
)

// proxiedEngine opens an engine on st's schema through a pgtest.Proxy in
// front of the server.
func proxiedEngine(t *testing.T, st *store) (*idempg.Engine, *pgtest.Proxy) {
	t.Helper()
	cfg, proxy := pgtest.ProxiedConfig(t, pgtest.Env)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	o := st.opts
	e, err := idempg.Open(context.Background(), pool, &o, &idemcore.Options{PruneInterval: -1, ReplayCacheBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e, proxy
}

// The outcomes a cut COMMIT may have, as a test expects them.
const (
	committed = "committed" // the transaction committed: the call answers
	aborted   = "aborted"   // it rolled back: the call fails, nothing stored
	either    = "either"    // either, consistently with what the call said
)

// TestDoTxCommitCut cuts DoTx's connection at its COMMIT, through a TCP
// proxy between pgx and the server:
//
//   - answer lost: the COMMIT ran, its answer is dropped;
//   - cut at once: the COMMIT is forwarded and both sides closed at once
//     (the server may read it, or reset the connection first);
//   - commit arrives late: the client's side is cut while the COMMIT is
//     held back; it reaches the server only after another connection's
//     statement (the engine's read back) was answered;
//   - commit never arrives: the COMMIT is dropped;
//   - commit lost, its connection left open: the COMMIT is dropped and the
//     server's side kept open, idle in its transaction until the server's
//     idle-in-transaction timeout ends it.
//
// pgx answers a failed read by closing the connection with a cancel
// request, which may cancel a COMMIT that is running; the late case runs
// with the proxy dropping cancel requests (its COMMIT then commits) and
// with them (either outcome).
//
// What the caller is told must be what is stored: an answer equal to the
// done record, fn's effect once; or an error (never ErrFenced: no other
// owner exists), no record and no effect, and the next call runs fn once.
// The engine resolves the ambiguity by reading, never by writing again: no
// INSERT, UPDATE or DELETE leaves any connection after the cut.
func TestDoTxCommitCut(t *testing.T) {
	for _, tc := range []struct {
		name        string
		cut         func(p *pgtest.Proxy, marker string)
		dropCancels bool
		want        string
	}{
		{"answer lost", (*pgtest.Proxy).CutAfter, false, committed},
		{"cut at once", (*pgtest.Proxy).CutAtOnce, false, either},
		{"commit arrives late", (*pgtest.Proxy).CutDelayed, true, committed},
		{"commit arrives late, cancel request sent", (*pgtest.Proxy).CutDelayed, false, either},
		{"commit never arrives", (*pgtest.Proxy).CutBefore, false, aborted},
		// The server connection stays open: the transaction is in
		// progress until the server's idle-in-transaction timeout (the
		// store's 2 s lease) aborts it, and the engine waits for that.
		{"commit lost, its connection left open", (*pgtest.Proxy).CutHeld, true, aborted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := newStore(t, pgtest.Env)
			ctx := context.Background()
			if _, err := st.pool.Exec(ctx, "CREATE TABLE "+st.opts.Schema+".effects (key text PRIMARY KEY, n int NOT NULL)"); err != nil {
				t.Fatal(err)
			}
			e, proxy := proxiedEngine(t, st)
			if tc.dropCancels {
				proxy.DropCancelRequests()
			}
			var runs atomic.Int32
			fn := func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
				runs.Add(1)
				_, err := tx.Exec(ctx, "INSERT INTO "+st.opts.Schema+".effects (key, n) VALUES ('k', 1) ON CONFLICT (key) DO UPDATE SET n = effects.n + 1")
				return []byte("charged-7f3a"), err
			}
			// pgx sends a transaction's COMMIT as a simple query.
			tc.cut(proxy, "commit\x00")
			res, err := e.DoTx(ctx, "k", []byte("fp"), fn)
			if proxy.Cut() != 1 || runs.Load() != 1 {
				t.Fatalf("the proxy cut %d connections, fn ran %d times; want 1 and 1", proxy.Cut(), runs.Load())
			}
			after := bytes.ToUpper(proxy.SentAfterCut())
			for _, w := range []string{"INSERT", "UPDATE", "DELETE"} {
				if bytes.Contains(after, []byte(w)) {
					t.Errorf("an %s after the cut: the ambiguity must be resolved by reading back, not by writing again:\n%q", w, after)
				}
			}
			effect := func() int {
				var n int
				err := st.pool.QueryRow(ctx, "SELECT n FROM "+st.opts.Schema+".effects WHERE key = 'k'").Scan(&n)
				if err != nil && !errors.Is(err, pgx.ErrNoRows) {
					t.Fatal(err)
				}
				return n
			}
			check := st.open(t, &idemcore.Options{ReplayCacheBytes: -1})
			switch {
			case err == nil && tc.want == aborted:
				t.Fatalf("DoTx whose COMMIT never arrived answered %+v", res)
			case err != nil && tc.want == committed:
				t.Fatalf("DoTx whose COMMIT committed: %v; want fn's answer", err)
			case err != nil:
				t.Logf("rolled back: %v", err)
				if errors.Is(err, idemcore.ErrFenced) {
					t.Fatalf("DoTx: %v; no other owner exists", err)
				}
				if _, gerr := check.Get("k"); !errors.Is(gerr, idemcore.ErrNotFound) || effect() != 0 {
					t.Fatalf("the call failed (%v), yet the key has a record (%v) or the effect committed (%d)", err, gerr, effect())
				}
				if res, err = check.DoTx(ctx, "k", []byte("fp"), fn); err != nil || runs.Load() != 2 || res.Replayed {
					t.Fatalf("the retry: %+v, %v, fn ran %d times; want a second run", res, err, runs.Load())
				}
			}
			if string(res.Response) != "charged-7f3a" {
				t.Fatalf("answer %+v, want fn's", res)
			}
			// What the caller was told is what is stored.
			rec, err := check.Get("k")
			if err != nil || rec.State != idemcore.StateDone || string(rec.Response) != "charged-7f3a" {
				t.Fatalf("record: %+v, %v; want done with the caller's answer", rec, err)
			}
			if n := effect(); n != 1 {
				t.Fatalf("the effect committed %d times, want once", n)
			}
			replay, err := check.DoTx(ctx, "k", []byte("fp"), func(context.Context, pgx.Tx) ([]byte, error) {
				t.Error("fn ran again")
				return nil, nil
			})
			if err != nil || !replay.Replayed || string(replay.Response) != "charged-7f3a" {
				t.Fatalf("replay: %+v, %v", replay, err)
			}
		})
	}
}

// TestDoCompleteCut cuts the connection of Do's done record (its UPDATE and
// the implicit COMMIT of its batch, sent together) in the ways
// TestAmbiguousCommitReadBack does not: forwarded and closed at once (the
// server may run it, and the call answers fn's response, the stored one; or
// the close resets the connection first, or pgx's cancel request cancels
// it: an unknown outcome), and held back until after the engine's read back
// (the write arrives late). A
// late write cannot be seen by any read before it arrives: the read back
// finds the record still started with this claim's token, so the write is
// sent again on a fresh connection, fenced by the same token; whichever of
// the two lands first stores the outcome, and the other finds it done with
// this token, which is success, never ErrFenced. If the connection stays
// unusable the call fails with its error, an unknown outcome, and the next
// call replays the late write or recovers the key (fn runs again with
// Recovered, and the late write is fenced off). Either way the answer is
// the stored one, and fn ran twice only as a recovery.
func TestDoCompleteCut(t *testing.T) {
	for _, tc := range []struct {
		name string
		cut  func(p *pgtest.Proxy, marker string)
		// dropCancels: pgx's cancel request may cancel the write while
		// it runs (see TestDoTxCommitCut); dropped, the write commits.
		dropCancels bool
		want        string
	}{
		// The proxy's close may reset the server's side before it read
		// the whole batch: the write may or may not run.
		{"cut at once", (*pgtest.Proxy).CutAtOnce, false, either},
		{"write arrives late", (*pgtest.Proxy).CutDelayed, true, either},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := newStore(t, pgtest.Env)
			e, proxy := proxiedEngine(t, st)
			if tc.dropCancels {
				proxy.DropCancelRequests()
			}
			ctx := context.Background()
			var (
				runs      atomic.Int32
				recovered atomic.Bool
			)
			fn := func(ctx context.Context) ([]byte, error) {
				if runs.Add(1) > 1 {
					c, _ := idemcore.CallFrom(ctx)
					recovered.Store(c.Recovered && c.Attempt == 2)
				}
				return []byte("charged-7f3a"), nil
			}
			// The response is a parameter of the UPDATE's Bind.
			tc.cut(proxy, "charged-7f3a")
			res, firstErr := e.Do(ctx, "k", []byte("fp"), fn)
			err := firstErr
			if proxy.Cut() != 1 || runs.Load() != 1 {
				t.Fatalf("cut %d connections, fn ran %d times; want 1 and 1", proxy.Cut(), runs.Load())
			}
			switch {
			case tc.want == committed && (err != nil || string(res.Response) != "charged-7f3a"):
				t.Fatalf("Do whose write ran: %+v, %v; want fn's answer", res, err)
			case err == nil && string(res.Response) != "charged-7f3a":
				t.Fatalf("Do: %+v; want fn's answer", res)
			case errors.Is(err, idemcore.ErrFenced):
				t.Fatalf("Do: %v; no other owner exists", err)
			case err != nil:
				t.Logf("unknown outcome: %v", err)
			}
			// A write after the cut comes only after a read back (never
			// blind), on a fresh connection, fenced by the same token: it
			// lands once, or finds the late write done with its token.
			// The next call replays the late write; or, if it reads the key
			// before that write lands, recovers the interrupted execution
			// (fn runs again, Recovered) and fences the late write off.
			again, err := e.Do(ctx, "k", []byte("fp"), fn)
			switch {
			case err != nil || string(again.Response) != "charged-7f3a":
				t.Fatalf("the next call: %+v, %v", again, err)
			case runs.Load() == 1 && !again.Replayed:
				t.Fatalf("the next call: %+v; fn did not run, so it must be a replay", again)
			case runs.Load() == 2 && (firstErr == nil || !recovered.Load()):
				t.Fatalf("fn ran again, recovered %v; only the unknown outcome may be recovered", recovered.Load())
			case runs.Load() > 2:
				t.Fatalf("fn ran %d times", runs.Load())
			}
			rec, err := st.open(t, nil).Get("k")
			if err != nil || rec.State != idemcore.StateDone || string(rec.Response) != "charged-7f3a" || rec.Attempt != int(runs.Load()) {
				t.Fatalf("record: %+v, %v; want done by the last execution", rec, err)
			}
		})
	}
}
