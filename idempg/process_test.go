package idempg_test

// Multi-process cases: at least two OS processes with distinct pids against
// one Postgres. The child is this test binary, re-executed with
// IDEMPG_CHILD naming its role (see TestMain).

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idempg"
	"github.com/idemkit/idem/idempg/internal/pgtest"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/internal/testkit"
)

const (
	envChild  = "IDEMPG_CHILD"
	envSchema = "IDEMPG_SCHEMA"
	envKey    = "IDEMPG_KEY"
	envLease  = "IDEMPG_LEASE" // the child's Lease, if set (default 10 s)
	envMark   = "IDEMPG_MARK"  // the frozen role's mark: a file the parent creates before it resumes the child
)

func TestMain(m *testing.M) {
	if role := os.Getenv(envChild); role != "" {
		os.Exit(childMain(role))
	}
	idemtest.ChildMain()
	os.Exit(testkit.Main(m, nil))
}

// childMain runs a child's role and returns its exit status. It reports on
// its report pipe (testkit.Report), one line per event: "started <pid>" once fn runs, then "result
// <response>" or "error <text>" (with "fenced" if the error wraps
// ErrFenced).
func childMain(role string) int {
	report := testkit.Report()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(pgtest.Env))
	if err != nil {
		fmt.Fprintln(report, "error", err)
		return 1
	}
	defer pool.Close()
	opts := &idempg.Options{Schema: os.Getenv(envSchema), Lease: 10 * time.Second, Heartbeat: 9 * time.Second}
	if d, err := time.ParseDuration(os.Getenv(envLease)); err == nil {
		opts.Lease, opts.Heartbeat = d, 0 // the lease, and the idle-in-transaction timeout with it
	}
	e, err := idempg.Open(ctx, pool, opts, &idemcore.Options{PruneInterval: -1})
	if err != nil {
		fmt.Fprintln(report, "error", err)
		return 1
	}
	defer e.Close()
	key := os.Getenv(envKey)
	in := bufio.NewReader(os.Stdin)
	var res idemcore.Result
	switch role {
	case "do":
		// fn says it started, then waits for a line on stdin (for ever,
		// if the parent kills it instead).
		res, err = e.Do(ctx, key, []byte("fp"), func(ctx context.Context) ([]byte, error) {
			fmt.Fprintln(report, "started", os.Getpid())
			_, _ = in.ReadString('\n')
			return []byte("child"), nil
		})
	case "dotx":
		res, err = e.DoTx(ctx, key, []byte("fp"), func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			if _, err := tx.Exec(ctx, "INSERT INTO "+opts.Schema+".effects (key, n) VALUES ($1, 1) ON CONFLICT (key) DO UPDATE SET n = effects.n + 1", key); err != nil {
				return nil, err
			}
			fmt.Fprintln(report, "started", os.Getpid())
			_, _ = in.ReadString('\n')
			return []byte("child"), nil
		})
	case "frozen":
		// fn works in steps, looking at its context before each. A step
		// that comes after a pause (the clock jumped) with the parent's
		// mark present is the first after the parent resumed the process:
		// fn does its effect then if its context is live. The pause is
		// measured before the look, so a look made before the freeze
		// never counts as one made after it.
		mark := os.Getenv(envMark)
		res, err = e.Do(ctx, key, []byte("fp"), func(ctx context.Context) ([]byte, error) {
			fmt.Fprintln(report, "started", os.Getpid())
			last := time.Now()
			for {
				now := time.Now()
				resumed := now.Sub(last) > 50*time.Millisecond && marked(mark)
				last = now
				if err := ctx.Err(); err != nil {
					fmt.Fprintf(report, "ended after the mark=%v cause=%v\n", marked(mark), context.Cause(ctx))
					return nil, err
				}
				if resumed {
					fmt.Fprintln(report, "effect after the freeze")
					return []byte("child"), nil
				}
			}
		})
	default:
		fmt.Fprintln(report, "error unknown role", role)
		return 2
	}
	switch {
	case errors.Is(err, idemcore.ErrFenced):
		fmt.Fprintln(report, "error fenced:", err)
	case err != nil:
		fmt.Fprintln(report, "error", err)
	default:
		fmt.Fprintln(report, "result", string(res.Response))
	}
	return 0
}

// marked reports whether the file at path exists.
func marked(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// startChild starts the test binary as a child in role on st's schema for
// key, with env added to its environment, and waits until its fn has
// started.
func startChild(t *testing.T, st *store, role, key string, env ...string) *testkit.Child {
	t.Helper()
	c := spawn(t, st, role, key, env...)
	if line, want := c.Next(), fmt.Sprintf("started %d", c.Pid()); line != want {
		t.Fatalf("child: %q, want %q", line, want)
	}
	if c.Pid() == os.Getpid() {
		t.Fatal("the child has the parent's pid")
	}
	return c
}

// spawn starts the test binary as a child in role on st's schema for key.
func spawn(t *testing.T, st *store, role, key string, env ...string) *testkit.Child {
	t.Helper()
	return testkit.Start(t, os.Args[0], []string{"-test.run=^$"},
		append([]string{envChild + "=" + role, envSchema + "=" + st.opts.Schema, envKey + "=" + key}, env...)...)
}

// TestProcessKilledHolderTakenOverAfterLease: a child process holding a key
// (its fn running under a live lease) is SIGKILLed. While its lease lasts,
// this process does not run fn (InProgressError); once the lease has lapsed
// by the database's clock, it takes the key over: fn runs a second time,
// attempt 2, with Recovered set.
func TestProcessKilledHolderTakenOverAfterLease(t *testing.T) {
	st := newStore(t, pgtest.Env)
	c := startChild(t, st, "do", "k")
	c.Kill()

	e := st.open(t, &idemcore.Options{InFlight: idemcore.InFlightFail})
	var runs atomic.Int32
	var call idemcore.Call
	fn := func(ctx context.Context) ([]byte, error) {
		runs.Add(1)
		call, _ = idemcore.CallFrom(ctx)
		return []byte("parent"), nil
	}
	if _, err := e.Do(context.Background(), "k", []byte("fp"), fn); !errors.Is(err, idemcore.ErrInProgress) {
		t.Fatalf("while the dead child's lease lasts: %v, want ErrInProgress", err)
	}
	if runs.Load() != 0 {
		t.Fatal("fn ran while the lease lasted")
	}
	st.offset.Add(int64(11 * time.Second)) // past the child's 10 s lease
	res, err := e.Do(context.Background(), "k", []byte("fp"), fn)
	if err != nil {
		t.Fatal(err)
	}
	if runs.Load() != 1 || !call.Recovered || call.Attempt != 2 || res.Attempt != 2 || string(res.Response) != "parent" {
		t.Fatalf("takeover: %+v, call %+v, %d runs; want one recovered run, attempt 2", res, call, runs.Load())
	}
}

// TestProcessStoppedOwnerCompletionRefused: a child process is SIGSTOPped
// while its fn runs, this process takes the key over past the child's
// lease, and the child, resumed, finishes fn: its completion is refused
// (ErrFenced) and the record keeps this process's outcome.
func TestProcessStoppedOwnerCompletionRefused(t *testing.T) {
	st := newStore(t, pgtest.Env)
	c := startChild(t, st, "do", "k")
	if err := c.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	e := st.open(t, nil)
	st.offset.Add(int64(11 * time.Second)) // past the child's 10 s lease
	res, err := e.Do(context.Background(), "k", []byte("fp"), func(context.Context) ([]byte, error) { return []byte("parent"), nil })
	if err != nil || string(res.Response) != "parent" || res.Attempt != 2 {
		t.Fatalf("takeover: %+v, %v", res, err)
	}
	if err := c.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	c.Send("go")
	if line := c.Next(); !strings.HasPrefix(line, "error fenced:") {
		t.Fatalf("the resumed child's completion: %q, want it refused (ErrFenced)", line)
	}
	rec, err := e.Get("k")
	if err != nil || string(rec.Response) != "parent" || rec.Attempt != 2 {
		t.Fatalf("record: %+v, %v; want this process's outcome", rec, err)
	}
}

// TestProcessDoTxNoEffectTwice: a child process is SIGKILLed inside a DoTx
// fn that wrote its effect; the server rolls its transaction back, so this
// process's DoTx of the key runs fn once and the effect counts once. Then
// a child replays it and writes nothing.
func TestProcessDoTxNoEffectTwice(t *testing.T) {
	st := newStore(t, pgtest.Env)
	ctx := context.Background()
	if _, err := st.pool.Exec(ctx, "CREATE TABLE "+st.opts.Schema+".effects (key text PRIMARY KEY, n int NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	c := startChild(t, st, "dotx", "k")
	c.Kill()

	e := st.open(t, nil)
	res, err := e.DoTx(ctx, "k", []byte("fp"), func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		_, err := tx.Exec(ctx, "INSERT INTO "+st.opts.Schema+".effects (key, n) VALUES ('k', 1) ON CONFLICT (key) DO UPDATE SET n = effects.n + 1")
		return []byte("parent"), err
	})
	if err != nil || string(res.Response) != "parent" || res.Attempt != 1 {
		t.Fatalf("DoTx after the killed child: %+v, %v; want a first execution (nothing of the child's committed)", res, err)
	}
	c2 := spawn(t, st, "dotx", "k")
	if err := c2.Wait(); err != nil || !slices.Equal(c2.Reports(), []string{"result parent"}) {
		t.Fatalf("a second process's DoTx: %q, %v; want the replay of this one's", c2.Reports(), err)
	}
	var n int
	if err := st.pool.QueryRow(ctx, "SELECT n FROM "+st.opts.Schema+".effects WHERE key = 'k'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("the effect counted %d times, want once", n)
	}
}

// TestProcessStoppedInDoTx: a child process is SIGSTOPped inside a DoTx fn
// that wrote its effect, its transaction open and holding the key's row.
// This process's DoTx of the key waits for the row (not taking the key for
// free, not failing) until the server ends the stopped session
// (idle_in_transaction_session_timeout, the child's 2 s lease) and rolls
// its transaction back; then fn runs here, once, as a first execution. The
// child, resumed, finishes its fn: its DoTx fails (its session is gone),
// and the effect counts once, this process's.
func TestProcessStoppedInDoTx(t *testing.T) {
	st := newStore(t, pgtest.Env)
	ctx := context.Background()
	if _, err := st.pool.Exec(ctx, "CREATE TABLE "+st.opts.Schema+".effects (key text PRIMARY KEY, n int NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	c := startChild(t, st, "dotx", "k", envLease+"=2s")
	if err := c.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	e := st.open(t, nil)
	res, err := e.DoTx(ctx, "k", []byte("fp"), func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		_, err := tx.Exec(ctx, "INSERT INTO "+st.opts.Schema+".effects (key, n) VALUES ('k', 1) ON CONFLICT (key) DO UPDATE SET n = effects.n + 1")
		return []byte("parent"), err
	})
	if err != nil || string(res.Response) != "parent" || res.Replayed || res.Attempt != 1 {
		t.Fatalf("DoTx while the stopped child held the key: %+v, %v; want a first execution once the server ended the child's session", res, err)
	}
	if err := c.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	c.Send("go")
	if line := c.Next(); !strings.HasPrefix(line, "error") {
		t.Fatalf("the resumed child's DoTx: %q, want an error (its transaction was rolled back)", line)
	}
	var n int
	if err := st.pool.QueryRow(ctx, "SELECT n FROM "+st.opts.Schema+".effects WHERE key = 'k'").Scan(&n); err != nil || n != 1 {
		t.Fatalf("the effect: %d, %v; want once", n, err)
	}
	rec, err := e.Get("k")
	if err != nil || rec.State != idemcore.StateDone || string(rec.Response) != "parent" {
		t.Fatalf("record: %+v, %v; want this process's outcome", rec, err)
	}
}

// TestProcessFrozenOwnerSeesLeaseEnd: a child process whose fn runs (in
// steps, each after a look at its context) is SIGSTOPped past its lease;
// this process takes the key over (attempt 2, Recovered) once the lease has
// lapsed by the database's clock, then resumes the child. fn's first look
// after the freeze finds its context ended (cause ErrLeaseLost), whichever
// of its goroutines runs first: it does no effect after attempt 2's (issue
// 18, item 2). The child runs on one P (GOMAXPROCS=1, a starved scheduler):
// the goroutine running fn when it froze runs first after it.
func TestProcessFrozenOwnerSeesLeaseEnd(t *testing.T) {
	st := newStore(t, pgtest.Env)
	mark := filepath.Join(t.TempDir(), "resumed")
	c := startChild(t, st, "frozen", "k", envLease+"=1s", envMark+"="+mark, "GOMAXPROCS=1")
	if err := c.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	e := st.open(t, nil) // waits for the frozen child's lease to lapse (real time, the database's clock)
	var call idemcore.Call
	res, err := e.Do(context.Background(), "k", []byte("fp"), func(ctx context.Context) ([]byte, error) {
		call, _ = idemcore.CallFrom(ctx)
		return []byte("parent"), nil
	})
	if err != nil || string(res.Response) != "parent" || call.Attempt != 2 || !call.Recovered {
		t.Fatalf("takeover: %+v, %v, call %+v; want attempt 2, recovered", res, err, call)
	}
	if err := os.WriteFile(mark, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := c.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if line := c.Next(); line != "ended after the mark=true cause="+idemcore.ErrLeaseLost.Error() {
		t.Fatalf("the resumed child's fn: %q; want its first look after the freeze to find its context ended by ErrLeaseLost, before any effect", line)
	}
	if line := c.Next(); !strings.HasPrefix(line, "error") {
		t.Fatalf("the resumed child's Do: %q, want an error (an interruption)", line)
	}
	rec, err := e.Get("k")
	if err != nil || string(rec.Response) != "parent" || rec.Attempt != 2 {
		t.Fatalf("record: %+v, %v; want this process's outcome", rec, err)
	}
}
