package idemtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/internal/testkit"
)

// envHistoryOps sets the number of calls of the histories group's DoTx
// history (default historyOps, the CI slice).
const envHistoryOps = "IDEMTEST_HISTORY_OPS"

// historyOps is the DoTx history's number of calls in CI.
const historyOps = 800

// histories records what calls and the dispatcher did under concurrent
// traffic with cancellations, and checks it against the contract: DoTx's
// history per key with porcupine against testkit.ContractModel (and its
// effects counted), and the outbox's deliveries with testkit.OutboxHistory.
// Each checker is shown to reject bad histories by its own test
// (TestContractModelRejects in the root package, TestOutboxHistoryRejects
// in internal/testkit).
func (s *suite[T]) histories(t *testing.T) {
	t.Run("DoTx under cancellations, checked per key", s.dotxHistory)
	t.Run("outbox: every committed message delivered, in order, across a restart", s.outboxHistory)
}

// dotxHistory runs DoTx calls from 8 clients on a window of keys that moves
// on (a key sees about eight calls, mostly at once), with fns that write an
// effect row of their own (key#response) and sometimes free the key
// (Retryable), and callers cancelled at random, before, during or after
// fn. It checks the history per key with porcupine (no double execution, no
// wrong replay, unknown outcomes resolved one way or the other), and that
// every key done has exactly one effect row, the done response's, and a key
// not done none: DoTx's writes commit with its record, once.
func (s *suite[T]) dotxHistory(t *testing.T) {
	total := historyOps
	if n, err := strconv.Atoi(os.Getenv(envHistoryOps)); err == nil && n > 0 {
		total = n
	}
	e, _ := s.fresh(t, Options{})
	var (
		issued  atomic.Int64
		history testkit.History
		mu      sync.Mutex
		keys    = map[string]bool{}
		wg      sync.WaitGroup
	)
	errFree := errors.New("nothing happened")
	const clients = 8
	for client := range clients {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(client), 41))
			for {
				i := issued.Add(1)
				if i > int64(total) {
					return
				}
				key := fmt.Sprintf("k%d", i/8+int64(r.IntN(16)))
				own := fmt.Sprintf("r%d", i)
				free := r.IntN(8) == 0
				ctx, cancel := context.WithCancel(bg)
				if r.IntN(5) == 0 {
					time.AfterFunc(time.Duration(r.IntN(3000))*time.Microsecond, cancel)
				}
				hold := time.Duration(r.IntN(1500)) * time.Microsecond
				var ranResp atomic.Value // a DoTx fn may run again on a backend without savepoints
				begin := history.Stamp()
				res, err := e.DoTx(ctx, key, fp, func(ctx context.Context, tx T) ([]byte, error) {
					if err := s.h.PutEffect(tx, key+"#"+own, own); err != nil {
						return nil, err
					}
					select {
					case <-time.After(hold):
					case <-ctx.Done():
						return nil, ctx.Err()
					}
					if free {
						return nil, idemcore.Retryable(errFree)
					}
					ranResp.Store(own)
					return []byte(own), nil
				})
				end := history.Stamp()
				cancel()
				ran, _ := ranResp.Load().(string)
				history.Add(client, begin, end, testkit.HistOf(t, key, own, res, err, ran))
				mu.Lock()
				keys[key] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()

	history.Check(t, "the DoTx history")

	// Effects: one row per done key, the done execution's; none otherwise.
	effects := s.effects(t, e)
	perKey := map[string][]string{}
	for k, v := range effects {
		key, own, ok := strings.Cut(k, "#")
		require.True(t, ok, "an effect row %q that no fn wrote", k)
		require.Equal(t, own, v)
		perKey[key] = append(perKey[key], own)
	}
	for key := range keys {
		r := record(t, e, key)
		switch {
		case r != nil && r.State == idemcore.StateDone:
			require.Equal(t, []string{string(r.Response)}, perKey[key], "%s: done with %q: its effect, once", key, r.Response)
		default:
			require.Empty(t, perKey[key], "%s: not done (%+v), yet effects committed", key, r)
		}
	}
	t.Logf("DoTx history checked: %v on %d keys; effect rows %d", &history, len(keys), len(effects))
}

// outboxHistory enqueues messages in DoTx calls from 6 clients (1 to 3 per
// call, ordered by the call's key), some of them rolled back (fn returns
// Retryable after enqueuing, and the client calls the key again), some
// cancelled, some replayed, while a dispatcher delivers them to a handler
// that fails one attempt in four; the engine is closed halfway with
// messages pending and opened again. Then every message of every committed
// execution must have been delivered at least once, in enqueue order per
// ordering key, with its downstream key, and no message of a rolled back
// or replayed call ever (testkit.OutboxHistory).
func (s *suite[T]) outboxHistory(t *testing.T) {
	c := newClock()
	var (
		rec      testkit.Recorder
		flakyMu  sync.Mutex
		flaky    = rand.New(rand.NewPCG(7, 7))
		payMu    sync.Mutex
		payloads = map[string][]string{} // per execution (its own response): what it enqueued
		keys     = map[string]bool{}
	)
	handler := rec.Handler(func(idemcore.Message) error {
		flakyMu.Lock()
		defer flakyMu.Unlock()
		if flaky.IntN(4) == 0 {
			return errors.New("downstream unavailable")
		}
		return nil
	})
	opts := outboxOptions(c, map[string]idemcore.Handler{"step": handler},
		idemcore.OutboxOptions{BaseBackoff: time.Second, MaxBackoff: time.Second, MaxAttempts: -1})
	e, store := s.fresh(t, opts)

	var seq atomic.Int64
	traffic := func(e Engine[T], round int) {
		var wg sync.WaitGroup
		for client := range 6 {
			wg.Go(func() {
				r := rand.New(rand.NewPCG(uint64(client), uint64(round)))
				for i := range 12 {
					key := fmt.Sprintf("order-%d-%d-%d", round, client, i/2) // two calls a key: the second replays or retries
					n := 1 + r.IntN(3)
					rollback := r.IntN(5) == 0
					ctx, cancel := context.WithCancel(bg)
					if r.IntN(6) == 0 {
						time.AfterFunc(time.Duration(r.IntN(2000))*time.Microsecond, cancel)
					}
					own := fmt.Sprintf("x%d", seq.Add(1))
					_, _ = e.DoTx(ctx, key, fp, func(ctx context.Context, tx T) ([]byte, error) {
						var ps []string
						for j := range n {
							p := fmt.Sprintf("%s/%d/%s", key, j, own)
							if err := s.h.Enqueue(tx, "step", []byte(p)); err != nil {
								return nil, err
							}
							ps = append(ps, p)
						}
						payMu.Lock()
						payloads[own] = ps
						payMu.Unlock()
						if err := ctx.Err(); err != nil {
							return nil, err
						}
						if rollback {
							return nil, idemcore.Retryable(errors.New("rolled back"))
						}
						return []byte(own), nil
					})
					cancel()
					payMu.Lock()
					keys[key] = true
					payMu.Unlock()
				}
			})
		}
		wg.Wait()
	}
	traffic(e, 1)
	pending := len(messages(t, e))
	e = s.reopen(t, e, store, opts) // messages pending (failed attempts wait for the clock) survive
	traffic(e, 2)

	// What committed: per done key, the messages its done execution
	// enqueued.
	committed := map[string][]string{}
	total := 0
	for key := range keys {
		r := record(t, e, key)
		if r == nil || r.State != idemcore.StateDone {
			continue
		}
		ps, ok := payloads[string(r.Response)]
		require.True(t, ok, "%s: done with %q, which no fn returned", key, r.Response)
		committed[key] = ps
		total += len(ps)
	}
	testkit.Eventually(t, "every committed message delivered", func() { c.Advance(time.Second) }, func() bool {
		_, ok := rec.Log()
		n := 0
		for _, o := range ok {
			if o {
				n++
			}
		}
		return n >= total && len(messages(t, e)) == 0
	})
	attempts, ok := rec.Log()
	if bad := testkit.OutboxHistory(committed, attempts, ok); len(bad) > 0 {
		t.Fatalf("the outbox's history breaks its promise:\n%s", strings.Join(bad, "\n"))
	}
	failed := 0
	for _, o := range ok {
		if !o {
			failed++
		}
	}
	t.Logf("outbox: %d keys done of %d, %d messages committed, %d attempts (%d failed), %d pending at the restart",
		len(committed), len(keys), total, len(attempts), failed, pending)
}
