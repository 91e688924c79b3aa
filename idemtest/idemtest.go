// Package idemtest is the conformance suite of idem's contract (DESIGN.md,
// "The contract" and "Outcomes, case by case"): every backend's engine runs it,
// the way every River driver runs riverdrivertest.Exercise and every
// litestream replica client runs RunWithReplicaClient.
//
// A backend's test opens the suite with one call, giving a Harness that opens
// engines on its storage:
//
//	func TestMain(m *testing.M) {
//		idemtest.ChildMain()
//		os.Exit(m.Run())
//	}
//
//	func TestConformance(t *testing.T) {
//		idemtest.Run(t, idemtest.Harness[*idem.Tx]{...})
//	}
//
// The suite's subtests come in groups, each holding a part of the contract:
//
//	outcomes     each row of DESIGN.md's table of outcomes, for Do and, where
//	             the row applies, DoTx, with waiters on the same key
//	dotx         fn's writes commit with the done record, once; group commit
//	keys         the key rules, for calls and operator calls
//	fingerprint  ErrFingerprintMismatch on the fast path, cold, while the first
//	             call runs, and on interrupted executions
//	retention    expiry through the clock seam (Options.Now, which drives
//	             the store's own clock too where it has one), and pruning
//	concurrency  singleflight, InFlightFail's *idem.InProgressError, other keys,
//	             re-entrance, histories checked against a model (porcupine)
//	recovery     re-execution with Recovered and the attempt, refusal with
//	             ErrIncomplete, Resolve, Forget
//	owned        a started record owned by a live process elsewhere (the
//	             backend's ownership rule, through OwnedElsewhere): waited
//	             for or refused, never recovered
//	restart      exact replays, nil versus empty, recovery at Open, ErrClosed
//	outbox       delivery with downstream keys, backoff, dead letters, order,
//	             restarts
//	histories    DoTx under cancellations checked per key against the
//	             contract's model (porcupine), its effects counted; the
//	             outbox's deliveries checked for at least once, in order
//	process      SIGKILL of a child process in fn or in a handler, and a store
//	             held by a live process (see ChildMain)
//	shared       engines of several processes on one store
//	             (OwnedAcrossProcesses): Forget, Resolve, RetryDead and
//	             DropDead through one engine are what the others' next calls
//	             see, never an answer from an engine's memory
//	crash matrix every failpoint in the code (idemcore, this package,
//	             the backend's module) × SIGKILL, panic and error, in a child
//	             running concurrent Do, DoTx, outbox and prune traffic; the
//	             parent reopens, retries every call and checks the promises
//	             (crash.go; EnvMatrixRuns sets the runs per cell). It needs
//	             the idemfail build (testkit.Failpoints) and the source tree
//	logs         keys, responses and payloads never logged
//
// RunBackend is the seam suite: it drives a Backend directly, without an
// engine, for the backend's side of the contract as the core relies on it
// (claims and fencing, completion, lookups, DoTx's transaction, prune, the
// outbox, waiting), as River's riverdrivertest.Exercise drives a driver:
//
//	func TestBackend(t *testing.T) {
//		idemtest.RunBackend(t, func(t testing.TB) idemcore.Backend[MyTx] { ... })
//	}
//
// Both take only idemcore's public types, so a backend written outside this
// module runs them: its engine is idemcore.New over its Backend.
//
// Subtests of behaviour that the contract promises but a known defect still
// breaks are skipped with a reason naming their issue, "pending fix: issue 8
// item N" (grep for pendingFix). Setting IDEMTEST_PENDING=run runs them
// anyway, to check a fix.
package idemtest

import (
	"context"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/internal/fault"
	"github.com/idemkit/idem/internal/testkit"
)

// Options are the contract's settings the suite opens engines with: each field
// means what the idem.Options field of the same name means, zero included.
// Backend settings (files, pools, sync) are the Harness's business.
type Options struct {
	// Retention is the retention window; zero means idem.DefaultRetention.
	Retention time.Duration
	// Recovery is the policy for interrupted executions.
	Recovery idemcore.RecoveryPolicy
	// InFlight is the policy for concurrent duplicates.
	InFlight idemcore.InFlightPolicy
	// RetryAfter is the wait an *idem.InProgressError suggests; zero means
	// idem.DefaultRetryAfter.
	RetryAfter time.Duration
	// MaxResponseSize is the most bytes stored for an outcome; zero means
	// idem.DefaultMaxResponseSize.
	MaxResponseSize int
	// Now is the suite's clock: a fake clock it stops and moves (it always
	// sets it), the seam through which it drives every time the contract
	// judges (retention, expiry, pruning, the outbox's backoff). The harness
	// passes it on as the engine's clock, and, if the store judges time by
	// a clock of its own (Postgres: the database's), makes that clock read
	// it too for the times of records and messages, so that the suite's
	// time is the store's (leases are ExpireOwners' to move).
	Now func() time.Time
	// Outbox configures the dispatcher. The suite sets Dispatch, Handlers,
	// BaseBackoff, MaxBackoff, MaxAttempts and PollInterval as it needs.
	Outbox idemcore.OutboxOptions
	// Logger receives the engine's own events; nil discards them. The suite
	// sets it to check that keys and responses are never logged.
	Logger *slog.Logger
}

// Engine returns o as the engine's settings, every field of o in the
// idem.Options field of its name, with the background pruner disabled (the
// suite prunes when it means to, with Engine.Prune): one conversion for every
// harness, which adds its backend's settings (idem.BoltOptions on bbolt).
func (o Options) Engine() *idemcore.Options {
	return &idemcore.Options{
		Retention: o.Retention, Recovery: o.Recovery, InFlight: o.InFlight, RetryAfter: o.RetryAfter,
		MaxResponseSize: o.MaxResponseSize, Now: o.Now, Outbox: o.Outbox, Logger: o.Logger,
		PruneInterval: -1,
	}
}

// Engine is an engine under test: the methods every backend's engine offers,
// with the meaning and errors of idemcore.Engine's methods of the same names
// (the adapters' interface, idemcore.TxDoer with T the backend's
// transaction, plus the operator, outbox and lifecycle calls).
// *idemcore.Engine[T] satisfies it, so a backend written outside this module
// runs the suite on idemcore.New over its Backend; so do the engines that
// wrap it, *idem.Engine (Engine[*idem.Tx]) and *idempg.Engine
// (Engine[pgx.Tx]).
type Engine[T any] interface {
	idemcore.TxDoer[T]
	// Get returns key's live record, or an error wrapping idem.ErrNotFound.
	Get(key string) (*idemcore.Record, error)
	// Forget deletes key's record in any state.
	Forget(key string) error
	// Resolve completes key's interrupted execution by hand.
	Resolve(key string, response []byte, outcome *idemcore.Error) error
	// Records walks every live record.
	Records(fn func(r *idemcore.Record, err error) error) error
	// Prune reclaims the space of expired records now.
	Prune(ctx context.Context) (int, error)
	// Messages walks the outbox: pending messages, then dead letters.
	Messages(fn func(m *idemcore.Message, err error) error) error
	// RetryDead puts a dead letter back in the outbox.
	RetryDead(seq uint64) error
	// DropDead deletes a dead letter.
	DropDead(seq uint64) error
	// Handle registers an outbox handler for a topic.
	Handle(topic string, h idemcore.Handler)
	// Dispatch runs the dispatcher until ctx ends or the engine closes.
	Dispatch(ctx context.Context) error
	// Stats returns the engine's counters.
	Stats() idemcore.Stats
	// Shutdown closes the engine, waiting for running calls until ctx ends.
	Shutdown(ctx context.Context) error
	// Close closes the engine; it is idempotent.
	Close() error
}

var _ Engine[struct{}] = (*idemcore.Engine[struct{}])(nil)

// Hook points a Harness's Hook must support: the engine's state machine runs
// the hook set for a point each time it reaches it.
const (
	// PointWait is reached by a call that is about to wait for a running
	// call with the same key (InFlightWait), once per wait.
	PointWait = "do-wait"
	// PointAfterStarted is reached by Do after its started record committed,
	// before fn runs.
	PointAfterStarted = "do-after-started"
)

// CoreHook is Harness.Hook for an engine built on idemcore: it arms the
// failpoint of that name, which idemcore's state machine marks, to run fn.
// Failpoints exist only in a build with the idemfail tag (go test -tags
// idemfail), which the suite's hooks and crash matrix need; without it
// CoreHook panics, so a test that needs a hook cannot pass without one.
func CoreHook(point string, fn func()) (unset func()) {
	return fault.Set(point, func() error { fn(); return nil })
}

// Harness is how the suite reaches a backend: it opens engines on a store
// and gives the suite what only the backend can do. Every func field is
// required except Check and ExpireOwners (see each).
type Harness[T any] struct {
	// New creates an empty store and returns its name (a file path, a
	// database schema), which Open takes in this process or in a child
	// process of the test binary. The store is removed when t ends.
	New func(t testing.TB) string

	// Open opens an engine on the store named store with opts (all of them
	// passed on to the engine; backend settings are the harness's choice).
	// The suite closes every engine it opens. Opening a store again after
	// Close is a restart: the store's records and outbox must survive it.
	Open func(t testing.TB, store string, opts Options) (Engine[T], error)

	// PutEffect writes the effect row (key, value) inside tx, in a table of
	// the user's (not the engine's), as a DoTx fn does.
	PutEffect func(tx T, key, value string) error

	// Effects returns every effect row committed in e's store, by key.
	Effects func(e Engine[T]) (map[string]string, error)

	// Enqueue stores an outbox message for topic inside tx (idem.Tx.Enqueue:
	// ordered by the call's key).
	Enqueue func(tx T, topic string, payload []byte) error

	// Hook makes the engine run fn at point (PointWait, PointAfterStarted)
	// in this process until unset is called. The suite sets at most one hook
	// per point and never runs subtests in parallel. idemcore's state machine
	// marks both points as failpoints, so a backend built on it passes
	// CoreHook.
	Hook func(point string, fn func()) (unset func())

	// OwnedAcrossProcesses says whether engines in several processes share
	// one store, a started record being owned by the live process that
	// claimed it (Postgres's leases). False means one process holds the
	// store at a time (bbolt's file lock): a second Open elsewhere fails, and
	// every started record found at Open is an orphan. The shared group runs
	// only when it is true: several engines open on one store at once.
	OwnedAcrossProcesses bool

	// ExpireOwners makes every claim on the store lapse (moves the store's
	// clock past the lease, for the engines this process opens on it), so
	// that the started records of a killed process become orphans. Required
	// if OwnedAcrossProcesses.
	ExpireOwners func(t testing.TB, store string)

	// OpenWrapped opens an engine as Open does, over the engine's backend
	// wrapped by wrap: the suite passes test backends (OwnedElsewhere) that
	// change one backend operation, to exercise the engine's side of it.
	// The suite closes every engine it opens. If nil, the ownership cases
	// are skipped with a message.
	OpenWrapped func(t testing.TB, store string, opts Options, wrap func(idemcore.Backend[T]) idemcore.Backend[T]) (Engine[T], error)

	// InProcess says that a store lives in this process only (an in-memory
	// backend), so no child process can reach it: the process and crash
	// matrix groups are skipped.
	InProcess bool

	// Check, if set, checks the store's consistency after the suite closed
	// its engines (bbolt's Tx.Check).
	Check func(t testing.TB, store string)

	// Unreached names the failpoints that the engine Open makes never
	// reaches, each with the reason (a configuration that turns its code
	// off, such as bbolt's journal): the crash matrix runs no cells for
	// them, and says so. Every other point must fire in every cell. Naming
	// a point the code does not have fails the matrix.
	Unreached map[string]string
}

// Run runs the conformance suite on the backend h reaches, as subtests of t.
// Subtests never run in parallel (they share h.Hook). In a child process
// started by the suite it runs only the child's part and exits (ChildMain).
func Run[T any](t *testing.T, h Harness[T]) {
	if os.Getenv(envChild) != "" {
		if os.Getenv(envRun) == t.Name() {
			runChild(t, h)
		}
		return
	}
	switch {
	case h.New == nil, h.Open == nil, h.PutEffect == nil, h.Effects == nil, h.Enqueue == nil, h.Hook == nil:
		t.Fatal("idemtest: Harness needs New, Open, PutEffect, Effects, Enqueue and Hook")
	case h.OwnedAcrossProcesses && h.ExpireOwners == nil:
		t.Fatal("idemtest: Harness.ExpireOwners is required when OwnedAcrossProcesses")
	}
	s := &suite[T]{h: h, run: t.Name()}
	t.Run("outcomes", s.outcomes)
	t.Run("dotx", s.dotx)
	t.Run("keys", s.keys)
	t.Run("fingerprint", s.fingerprint)
	t.Run("retention", s.retention)
	t.Run("concurrency", s.concurrency)
	t.Run("recovery", s.recovery)
	t.Run("owned", s.owned)
	t.Run("restart", s.restart)
	t.Run("outbox", s.outbox)
	t.Run("histories", s.histories)
	if h.InProcess {
		t.Log("idemtest: Harness.InProcess: the process and crash matrix groups need a store a child process reaches; skipped")
	} else {
		t.Run("process", s.process)
	}
	t.Run("shared", s.shared)
	if !h.InProcess {
		t.Run("crash matrix", s.matrix)
	}
	t.Run("logs", s.logs)
}

// suite is one run of the suite over a harness.
type suite[T any] struct {
	h   Harness[T]
	run string // the name of the test that called Run, for child processes
}

// envPending, set to "run", runs the subtests that pendingFix skips.
const envPending = "IDEMTEST_PENDING"

// pendingFix skips the rest of a subtest whose behaviour the contract promises
// but a known defect still breaks, naming the issue that fixes it ("issue 8
// item 1"). With IDEMTEST_PENDING=run it does nothing, so the subtest runs.
func pendingFix(t *testing.T, issue string) {
	t.Helper()
	if os.Getenv(envPending) == "run" {
		return
	}
	t.Skipf("pending fix: %s (IDEMTEST_PENDING=run runs it)", issue)
}

// open opens an engine on store with opts and closes it when t ends.
func (s *suite[T]) open(t testing.TB, store string, opts Options) Engine[T] {
	t.Helper()
	return s.openWith(t, store, opts, nil)
}

// openWith is open over the engine's backend wrapped by wrap
// (Harness.OpenWrapped), or as it is if wrap is nil.
func (s *suite[T]) openWith(t testing.TB, store string, opts Options, wrap func(idemcore.Backend[T]) idemcore.Backend[T]) Engine[T] {
	t.Helper()
	if opts.Now == nil {
		opts.Now = newClock().Now
	}
	var e Engine[T]
	var err error
	if wrap == nil {
		e, err = s.h.Open(t, store, opts)
	} else {
		e, err = s.h.OpenWrapped(t, store, opts, wrap)
	}
	if err != nil {
		t.Fatalf("open %s: %v", store, err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return e
}

// fresh creates a store, opens an engine on it with opts and returns both;
// the store is checked (Harness.Check) after the engine is closed.
func (s *suite[T]) fresh(t testing.TB, opts Options) (Engine[T], string) {
	t.Helper()
	store := s.h.New(t)
	if s.h.Check != nil {
		t.Cleanup(func() { s.h.Check(t, store) }) // runs after the engine's Close
	}
	return s.open(t, store, opts), store
}

// reopen closes e and opens its store again with opts: a restart.
func (s *suite[T]) reopen(t testing.TB, e Engine[T], store string, opts Options) Engine[T] {
	t.Helper()
	if err := e.Close(); err != nil {
		t.Fatalf("close before restart: %v", err)
	}
	return s.open(t, store, opts)
}

// effects returns e's committed effect rows.
func (s *suite[T]) effects(t testing.TB, e Engine[T]) map[string]string {
	t.Helper()
	m, err := s.h.Effects(e)
	if err != nil {
		t.Fatalf("effects: %v", err)
	}
	if m == nil {
		m = map[string]string{}
	}
	return m
}

// waitersIn runs start, which starts calls that wait for a running call, and
// returns once n of them wait (PointWait).
func (s *suite[T]) waitersIn(t testing.TB, n int, start func()) {
	t.Helper()
	if n == 0 {
		start()
		return
	}
	var mu sync.Mutex
	waiting := 0
	all := make(chan struct{})
	unset := s.h.Hook(PointWait, func() {
		mu.Lock()
		defer mu.Unlock()
		if waiting++; waiting == n {
			close(all)
		}
	})
	defer unset()
	start()
	select {
	case <-all:
	case <-time.After(30 * time.Second): // a bound on a hang, not a timing claim
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("only %d of %d waiters arrived", waiting, n)
	}
}

// start is the suite's clock's first reading: a fixed wall-clock time, no
// monotonic reading.
var start = time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC)

// newClock returns a fake clock for Options.Now, stopped at start: the
// suite moves it, it never sleeps.
func newClock() *testkit.Clock { return testkit.NewClock(start) }
