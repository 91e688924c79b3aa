package idem_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit"
	"github.com/idemkit/idem/internal/testkit/boltkit"
)

// historyOps is the number of calls a history test makes: IDEM_HISTORY_OPS,
// or def (the CI slice).
func historyOps(def int) int {
	if n, err := strconv.Atoi(os.Getenv("IDEM_HISTORY_OPS")); err == nil && n > 0 {
		return n
	}
	return def
}

// TestHistoryUnderCancellationsAndRestarts records every call's start, end,
// input and output under concurrent traffic on many keys (16 clients, keys
// drawn from a window that moves on, so each key sees about ten calls), with
// random cancellations of callers (before, during and after fn) and engine
// restarts (Close under running calls, whose fns see their context end, then
// a reopen of the file), and checks the history per key with porcupine
// against testkit.ContractModel: no double execution, no wrong replay, unknown
// outcomes resolved one way or the other. The CI slice makes 10,000 calls;
// IDEM_HISTORY_OPS=1000000 is the long run (ROBUSTNESS.md).
func TestHistoryUnderCancellationsAndRestarts(t *testing.T) {
	total := historyOps(10000)
	path := filepath.Join(t.TempDir(), "idem.db")
	file, opts := &idem.BoltOptions{NoSync: true}, &idem.Options{PruneInterval: -1}
	var cur atomic.Pointer[idem.Engine]
	e, err := idem.OpenFile(path, file, opts)
	require.NoError(t, err)
	cur.Store(e)

	var (
		issued   atomic.Int64
		history  testkit.History
		restarts int
		wg       sync.WaitGroup
		stop     = make(chan struct{})
		restart  sync.RWMutex // readers: calls; writer: a restart
	)
	errFree := errors.New("nothing happened")
	const clients = 16
	for client := range clients {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(client), 77))
			for {
				i := issued.Add(1)
				if i > int64(total) {
					return
				}
				// Keys: a window of 32 that moves by one every 10 calls,
				// so a key sees about 10 calls, mostly at once.
				key := fmt.Sprintf("k%d", i/10+int64(r.IntN(32)))
				own := fmt.Sprintf("r%d", i)
				free := r.IntN(8) == 0
				ctx, cancel := context.WithCancel(context.Background())
				if r.IntN(6) == 0 {
					time.AfterFunc(time.Duration(r.IntN(300))*time.Microsecond, cancel)
				}
				delay := time.Duration(r.IntN(200)) * time.Microsecond
				var ranResp string
				restart.RLock()
				eng := cur.Load()
				begin := history.Stamp()
				res, err := eng.Do(ctx, key, nil, func(ctx context.Context) ([]byte, error) {
					select {
					case <-time.After(delay):
					case <-ctx.Done():
						return nil, ctx.Err()
					}
					if free {
						return nil, idem.Retryable(errFree)
					}
					ranResp = own
					return []byte(own), nil
				})
				end := history.Stamp()
				restart.RUnlock()
				cancel()
				history.Add(client, begin, end, testkit.HistOf(t, key, own, res, err, ranResp))
			}
		})
	}
	// Restarts: Close under running calls (it cancels their fns' contexts
	// and waits for them; calls that enter meanwhile get ErrClosed), then,
	// once every call on the old engine has returned (the restart lock), a
	// reopen of the file.
	restarter := make(chan struct{})
	go func() {
		defer close(restarter)
		r := rand.New(rand.NewPCG(5, 5))
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(20+r.IntN(30)) * time.Millisecond):
			}
			old := cur.Load()
			go func() { _ = old.Close() }() // under the calls that run now
			restart.Lock()
			if err := old.Close(); err != nil {
				t.Errorf("close: %v", err)
			}
			ne, err := idem.OpenFile(path, file, opts)
			if err != nil {
				restart.Unlock()
				t.Errorf("reopen: %v", err)
				return
			}
			cur.Store(ne)
			restarts++
			restart.Unlock()
		}
	}()
	wg.Wait()
	close(stop)
	<-restarter
	require.NoError(t, cur.Load().Close())
	boltkit.Check(t, path)

	history.Check(t, "the history")
	t.Logf("checked: %v; engine restarts under traffic: %d", &history, restarts)
}

// TestContractModelRejects shows the checker is not vacuous: a history with a
// double execution (two fresh answers for one key), or with a replay of a
// response the key was not done with, is rejected; the same histories
// without the fault pass.
func TestContractModelRejects(t *testing.T) {
	op := func(client int, call, ret int64, key, kind, resp string) porcupine.Operation {
		return porcupine.Operation{ClientId: client, Input: testkit.HistIn{Key: key, Op: kind, Resp: resp}, Call: call, Return: ret}
	}
	for _, tc := range []struct {
		name string
		h    []porcupine.Operation
		want porcupine.CheckResult
	}{
		{"one execution, its replays", []porcupine.Operation{
			op(0, 1, 2, "k", "exec", "a"), op(1, 3, 4, "k", "replay", "a"), op(2, 3, 5, "k", "replay", "a")}, porcupine.Ok},
		{"injected double execution", []porcupine.Operation{
			op(0, 1, 2, "k", "exec", "a"), op(1, 3, 4, "k", "exec", "b")}, porcupine.Illegal},
		{"double execution, concurrent", []porcupine.Operation{
			op(0, 1, 4, "k", "exec", "a"), op(1, 2, 3, "k", "exec", "b")}, porcupine.Illegal},
		{"injected wrong replay", []porcupine.Operation{
			op(0, 1, 2, "k", "exec", "a"), op(1, 3, 4, "k", "replay", "b")}, porcupine.Illegal},
		{"a replay before any execution", []porcupine.Operation{
			op(0, 1, 2, "k", "replay", "a"), op(1, 3, 4, "k", "exec", "a")}, porcupine.Illegal},
		{"an unknown outcome, then re-executed", []porcupine.Operation{
			op(0, 1, 2, "k", "unknown", "a"), op(1, 3, 4, "k", "exec", "b"), op(0, 5, 6, "k", "replay", "b")}, porcupine.Ok},
		{"an unknown outcome that completed", []porcupine.Operation{
			op(0, 1, 2, "k", "unknown", "a"), op(1, 3, 4, "k", "replay", "a")}, porcupine.Ok},
		{"an unknown outcome cannot explain another response", []porcupine.Operation{
			op(0, 1, 2, "k", "unknown", "a"), op(1, 3, 4, "k", "replay", "c")}, porcupine.Illegal},
		{"freed after done", []porcupine.Operation{
			op(0, 1, 2, "k", "exec", "a"), op(1, 3, 4, "k", "free", "")}, porcupine.Illegal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, porcupine.CheckOperationsTimeout(testkit.ContractModel, tc.h, 10*time.Second))
		})
	}
}
