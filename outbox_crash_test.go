package idem_test

// Crash tests of create_order (example_outbox_test.go's worked example)
// through DoTx and the outbox: a child process (obChild, started by
// testkit.RunKilled) opens the file, runs the call with a running dispatcher
// and is killed with SIGKILL at a failpoint; the parent reopens the file and
// retries the call, as a client would after a timeout.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/fault"
	"github.com/idemkit/idem/internal/testkit"
	"github.com/idemkit/idem/internal/testkit/boltkit"
)

// obPointInFn is a failpoint inside create_order's fn, after its writes and
// its Enqueue, before it returns.
const obPointInFn = "test-create-order-in-fn"

// obCrashKey is the call's idempotency key, built from its domain parts.
var obCrashKey = idem.KeyOf("create_order", "customer-8812", "sku-A1", "2025-01-02")

// obCreateOrder is create_order: the order, the intent to
// charge the card and the idempotency key, in one transaction.
func obCreateOrder(ctx context.Context, tx *idem.Tx) ([]byte, error) {
	orders, err := tx.Bucket([]byte("orders"))
	if err != nil {
		return nil, err
	}
	n, err := orders.NextSequence()
	if err != nil {
		return nil, err
	}
	id := fmt.Sprintf("order-%d", n)
	if err := orders.Put([]byte(id), []byte("customer-8812 sku-A1 1200")); err != nil {
		return nil, err
	}
	if err := tx.Enqueue("charge_card", []byte(id+" 1200")); err != nil {
		return nil, err
	}
	fault.Point(obPointInFn)
	return []byte(id), nil
}

func obCrashOptions(g ledger) *idem.Options {
	return &idem.Options{PruneInterval: -1, Outbox: idem.OutboxOptions{
		Dispatch:     true,
		PollInterval: time.Millisecond,
		Handlers: map[string]idem.Handler{"charge_card": func(ctx context.Context, m idem.Message) error {
			return g.charge(m.DownstreamKey)
		}},
	}}
}

// obChild is the child of TestOutboxCrash: args are the file and the
// gateway's ledger. It runs create_order, then waits for the dispatcher; a
// failpoint kills it on the way.
func obChild(args []string) {
	e, err := idem.Open(args[0], obCrashOptions(ledger(args[1])))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(3)
	}
	res, err := e.DoTx(context.Background(), obCrashKey, []byte("sku-A1 1200"), obCreateOrder)
	fmt.Fprintf(os.Stderr, "child: DoTx returned %q, %v; waiting for the dispatcher\n", res.Response, err)
	// The dispatcher charges the card; at its failpoint the process dies.
	time.Sleep(30 * time.Second)
}

func TestOutboxCrash(t *testing.T) {
	for _, tc := range []struct {
		name, point string
		committed   bool // the child's transaction committed before the kill
	}{
		{"inside fn before it returns", obPointInFn, false},
		{"after fn returned, before the commit", "dotx-before-commit", false},
		{"after the commit, before the response reaches the caller", "dotx-after-commit", true},
		{"after the handler charged the card, before the message is marked delivered", "outbox-after-handler", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			db := filepath.Join(dir, "idem.db")
			gateway := ledger(filepath.Join(dir, "gateway.log"))

			testkit.RunKilled(t, "outbox", tc.point+"=kill", []string{db, string(gateway)})
			childCharges := len(mustLines(t, gateway))
			if tc.point == "outbox-after-handler" {
				require.Equal(t, 1, childCharges, "the child charged the card before it died")
			}

			// Reopen, as the restarted service, and retry the call, as the client.
			e, err := idem.Open(db, obCrashOptions(gateway))
			require.NoError(t, err)
			defer func() { require.NoError(t, e.Close()); boltkit.Check(t, db) }()
			_, err = e.Get(obCrashKey)
			if tc.committed {
				require.NoError(t, err, "the child's call committed")
			} else {
				require.ErrorIs(t, err, idem.ErrNotFound, "nothing of the child's call committed")
			}

			first, err := e.DoTx(context.Background(), obCrashKey, []byte("sku-A1 1200"), obCreateOrder)
			require.NoError(t, err)
			require.Equal(t, tc.committed, first.Replayed)
			second, err := e.DoTx(context.Background(), obCrashKey, []byte("sku-A1 1200"), obCreateOrder)
			require.NoError(t, err)
			require.True(t, second.Replayed)
			require.Equal(t, string(first.Response), string(second.Response), "the retry returns the same order")

			orders := txDump(t, e, "orders")["orders"]
			require.Len(t, orders, 1, "exactly one order")
			require.Contains(t, orders, string(first.Response))

			testkit.Eventually(t, "the outbox to drain", nil, func() bool {
				s := obStats(t, e)
				return s.Pending == 0 && len(mustLines(t, gateway)) > 0
			})
			charges := mustLines(t, gateway)
			for _, key := range charges {
				require.Equal(t, idem.DownstreamKey(obCrashKey, 0), key, "the same downstream key every time")
			}
			if tc.point == "outbox-after-handler" {
				require.Len(t, charges, 2, "delivered again after the restart: at least once, deduplicated by the key")
			}
			t.Logf("%d charge(s), all with key %s: a gateway that dedupes by key charged once", len(charges), charges[0])
		})
	}
}

// mustLines reads the gateway's ledger.
func mustLines(t testing.TB, g ledger) []string {
	t.Helper()
	lines, err := g.lines()
	require.NoError(t, err)
	return lines
}
