package idemtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/internal/testkit"
)

// The child protocol: the suite re-executes the test binary with -test.run
// selecting the test that called Run, and these variables set. The child's
// Run does the role's part and reports its progress, one line at a time, on
// file descriptor 3; it exits when its standard input closes (the parent
// died) and after childLife in any case.
const (
	envChild    = "IDEMTEST_CHILD"    // the role: childDo, childDoTx, ...
	envRun      = "IDEMTEST_RUN"      // the name of the test that called Run
	envStore    = "IDEMTEST_STORE"    // the store to open (Harness.New's name)
	envRecovery = "IDEMTEST_RECOVERY" // the recovery policy, as a number
)

// Roles of a child process.
const (
	childDo     = "do"     // Do on crashKey whose fn reports "in-fn" and blocks
	childDoTx   = "dotx"   // DoTx on crashKey: an effect, a message, "in-fn", blocks
	childOutbox = "outbox" // enqueues one message whose handler reports "in-handler" and blocks
	childForget = "forget" // Forget of crashKey, then reports "forgotten" and blocks
)

const (
	crashKey  = "crash-7f3a"
	childLife = 2 * time.Minute
)

var childMainCalled atomic.Bool

// ChildMain prepares the test binary for the suite's child processes; call it
// first in TestMain, before m.Run:
//
//	func TestMain(m *testing.M) {
//		idemtest.ChildMain()
//		os.Exit(m.Run())
//	}
//
// In the parent it only records that it was called (the suite's process
// cases fail without it). In a child started by the suite, it makes the child
// exit as soon as its parent goes away, so that no child outlives a failed or
// interrupted test run; the child's part then runs in Run, under m.Run.
func ChildMain() {
	childMainCalled.Store(true)
	if os.Getenv(envChild) == "" {
		return
	}
	testkit.WatchParent()
}

// runChild is Run in a child process: the role's part, then exit. The
// parent kills it with SIGKILL before it exits on its own.
func runChild[T any](t *testing.T, h Harness[T]) {
	role, store := os.Getenv(envChild), os.Getenv(envStore)
	if role == childMatrix {
		matrixChild(t, h, store)
		return
	}
	report := testkit.Report()
	say := func(line string) {
		if _, err := fmt.Fprintln(report, line); err != nil {
			os.Exit(8)
		}
	}
	block := func() {
		time.Sleep(childLife)
		fmt.Fprintln(os.Stderr, "idemtest child: not killed")
		os.Exit(9)
	}
	fail := func(what string, err error) {
		fmt.Fprintf(os.Stderr, "idemtest child %s: %s: %v\n", role, what, err)
		os.Exit(10)
	}
	opts := Options{Now: newClock().Now}
	if p, err := strconv.Atoi(os.Getenv(envRecovery)); err == nil {
		opts.Recovery = idemcore.RecoveryPolicy(p)
	}
	if role == childOutbox {
		opts.Outbox = idemcore.OutboxOptions{Dispatch: true, PollInterval: time.Millisecond, Handlers: map[string]idemcore.Handler{
			"charge": func(ctx context.Context, m idemcore.Message) error {
				say("in-handler " + m.DownstreamKey)
				block()
				return nil
			},
		}}
	}
	e, err := h.Open(t, store, opts)
	if err != nil {
		fail("open", err)
	}
	say("open")
	switch role {
	case childDo:
		_, err = e.Do(bg, crashKey, fp, func(ctx context.Context) ([]byte, error) {
			say("in-fn")
			block()
			return nil, nil
		})
	case childDoTx:
		_, err = e.DoTx(bg, crashKey, fp, func(ctx context.Context, tx T) ([]byte, error) {
			if err := h.PutEffect(tx, crashKey, "x"); err != nil {
				return nil, err
			}
			if err := h.Enqueue(tx, "charge", []byte("1200")); err != nil {
				return nil, err
			}
			say("in-fn")
			block()
			return nil, nil
		})
	case childOutbox:
		_, err = e.DoTx(bg, crashKey, fp, func(ctx context.Context, tx T) ([]byte, error) {
			return []byte("ord_1"), h.Enqueue(tx, "charge", []byte("1200"))
		})
		if err == nil {
			say("committed")
		}
	case childForget:
		if err = e.Forget(crashKey); err == nil {
			say("forgotten")
		}
	default:
		err = errors.New("unknown role")
	}
	if err != nil {
		fail("call", err)
	}
	block()
}

// startChild starts a child in role on store, with the recovery policy p.
func (s *suite[T]) startChild(t testing.TB, role, store string, p idemcore.RecoveryPolicy) *testkit.Child {
	t.Helper()
	if !childMainCalled.Load() {
		t.Fatal("idemtest: call idemtest.ChildMain() first in TestMain: the process cases re-execute the test binary")
	}
	return testkit.Start(t, os.Args[0], []string{"-test.run=" + testkit.Pattern(s.run), "-test.count=1"},
		envChild+"="+role, envRun+"="+s.run, envStore+"="+store, envRecovery+"="+strconv.Itoa(int(p)))
}
