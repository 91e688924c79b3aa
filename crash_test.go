package idem_test

// Crash tests: a child process (this package's tests built with the idemfail
// tag, started by testkit.RunKilled) opens the file, runs one call and is
// killed with SIGKILL at a failpoint; the parent reopens the file and
// retries, as an orchestrator would after a crash.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit"
)

// crashChildren are the child processes of this package's crash tests, by
// name (testkit.Main runs them).
var crashChildren = map[string]func(args []string){
	"do":     doChild,
	"outbox": obChild,
}

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

// doChild is the child of a Do crash test: args are the file and the
// ledger. It runs create_order once; the failpoint kills it on the way.
func doChild(args []string) {
	e, err := idem.Open(args[0], nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(3)
	}
	_, err = e.Do(context.Background(), "order-7f3a", []byte(`{"sku":"A1"}`), createOrder(ledger(args[1])))
	fmt.Fprintln(os.Stderr, "child: not killed; Do returned", err)
}

// runKilledChild runs the Do child with the failpoint point armed to kill
// and checks that it died of SIGKILL.
func runKilledChild(t *testing.T, db, ledgerPath, point string) {
	t.Helper()
	testkit.RunKilled(t, "do", point+"=kill", []string{db, ledgerPath})
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
		// crash between the side effect and the log write.
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
	require.NoError(t, e.Resolve("order-7f3a", []byte(`{"order":"ord_1","status":"paid"}`), nil))
	res, err := e.Do(bg, "order-7f3a", []byte(`{"sku":"A1"}`), mustNotRun(t))
	require.NoError(t, err)
	require.True(t, res.Replayed)
}
