package idem_test

// Crash tests: the test binary re-executes itself as a child that opens the
// file, runs one call and is killed with SIGKILL at a failpoint; the parent
// reopens the file and retries, as an orchestrator would after a crash.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/fault"
)

const (
	envChild  = "IDEM_TEST_CRASH_CHILD"
	envDB     = "IDEM_TEST_CRASH_DB"
	envLedger = "IDEM_TEST_CRASH_LEDGER"
)

// ledger is the payment gateway's record of charges: one line per charge,
// synced before the charge returns, so it survives the kill.
type ledger string

func (l ledger) charge(key string) error {
	f, err := os.OpenFile(string(l), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := fmt.Fprintln(f, key); err != nil {
		return err
	}
	return f.Sync()
}

// lines returns every charge in the ledger, in order (none before the first).
func (l ledger) lines() ([]string, error) {
	f, err := os.Open(string(l))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var lines []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		lines = append(lines, s.Text())
	}
	return lines, s.Err()
}

// charges counts the charges made with key.
func (l ledger) charges(key string) int {
	lines, _ := l.lines()
	n := 0
	for _, line := range lines {
		if line == key {
			n++
		}
	}
	return n
}

// createOrder charges the card through the gateway, passing the idempotency
// key on; a recovered execution first asks the gateway whether the charge
// went through (reconciliation), as the contract tells fn to.
func createOrder(l ledger) func(ctx context.Context) ([]byte, error) {
	return func(ctx context.Context) ([]byte, error) {
		call, _ := idem.CallFrom(ctx)
		if !call.Recovered || l.charges(call.Key) == 0 {
			if err := l.charge(call.Key); err != nil {
				return nil, err
			}
		}
		return []byte(`{"order":"ord_1","status":"paid"}`), nil
	}
}

// crashChild runs the child's side of a crash test and reports whether this
// process is a child (it should then exit without running the tests).
func crashChild() bool {
	if os.Getenv(envChild) == "" {
		return false
	}
	e, err := idem.Open(os.Getenv(envDB), nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(3)
	}
	_, err = e.Do(context.Background(), "order-7f3a", []byte(`{"sku":"A1"}`), createOrder(ledger(os.Getenv(envLedger))))
	fmt.Fprintln(os.Stderr, "child: not killed; Do returned", err)
	os.Exit(4)
	return true
}

// runKilledChild runs the child with the failpoint armed and checks that it
// died of SIGKILL.
func runKilledChild(t *testing.T, db, ledgerPath, point string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envChild+"=1", envDB+"="+db, envLedger+"="+ledgerPath, fault.Env+"="+point)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.True(t, errors.As(err, &exit), "child: %v\n%s", err, out)
	ws, ok := exit.Sys().(syscall.WaitStatus)
	require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL, "the child must die of SIGKILL at %s; it said:\n%s", point, out)
}

func TestCrashAfterSideEffectIsRecovered(t *testing.T) {
	for _, tc := range []struct {
		point        string
		wantAttempt  int
		wantReplayed bool
	}{
		// Killed after the started commit, before fn ran: re-executed.
		{"do-after-started", 2, false},
		// Killed after the card was charged, before the done record: the
		// article's crash between the side effect and the log write.
		// Re-executed with Recovered set; fn reconciles and does not charge again.
		{"do-after-fn", 2, false},
		// Killed after the done commit, before the caller heard: replayed.
		{"do-after-done", 1, true},
	} {
		t.Run(tc.point, func(t *testing.T) {
			dir := t.TempDir()
			db, l := filepath.Join(dir, "idem.db"), ledger(filepath.Join(dir, "ledger"))
			runKilledChild(t, db, string(l), tc.point)

			e, err := idem.Open(db, nil)
			require.NoError(t, err)
			defer e.Close()
			r, err := e.Get("order-7f3a")
			require.NoError(t, err)
			require.Equal(t, map[bool]idem.State{true: idem.StateDone, false: idem.StateStarted}[tc.wantReplayed], r.State)

			res, err := e.Do(bg, "order-7f3a", []byte(`{"sku":"A1"}`), createOrder(l))
			require.NoError(t, err)
			require.Equal(t, `{"order":"ord_1","status":"paid"}`, string(res.Response))
			require.Equal(t, tc.wantAttempt, res.Attempt)
			require.Equal(t, tc.wantReplayed, res.Replayed)
			require.Equal(t, 1, l.charges("order-7f3a"), "the customer is charged once")

			again, err := e.Do(bg, "order-7f3a", []byte(`{"sku":"A1"}`), mustNotRun(t))
			require.NoError(t, err)
			require.True(t, again.Replayed)
		})
	}
}

func TestCrashUnderRefusePolicyWaitsForResolve(t *testing.T) {
	dir := t.TempDir()
	db, l := filepath.Join(dir, "idem.db"), ledger(filepath.Join(dir, "ledger"))
	runKilledChild(t, db, string(l), "do-after-fn")

	e, err := idem.Open(db, &idem.Options{Recovery: idem.RecoverRefuse})
	require.NoError(t, err)
	defer e.Close()
	_, err = e.Do(bg, "order-7f3a", []byte(`{"sku":"A1"}`), mustNotRun(t))
	require.ErrorIs(t, err, idem.ErrIncomplete)
	require.True(t, strings.Contains(err.Error(), "attempt 1"))
	// The operator checks the gateway, finds the charge, and resolves.
	require.Equal(t, 1, l.charges("order-7f3a"))
	require.NoError(t, e.Resolve("order-7f3a", []byte(`{"order":"ord_1","status":"paid"}`), "", ""))
	res, err := e.Do(bg, "order-7f3a", []byte(`{"sku":"A1"}`), mustNotRun(t))
	require.NoError(t, err)
	require.True(t, res.Replayed)
}
