package robustness

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"go.etcd.io/bbolt"

	"github.com/idemkit/idem"
)

// The workload that crash and power-cut tests run in a child and check in the
// parent: key i is a Do call when i is even, a DoTx call when it is odd.
//
//   - A Do call's effect is a line "key attempt recovered" appended to a
//     ledger file (outside the file system under test) and fsynced before fn
//     returns: the downstream system, which sees every execution.
//   - A DoTx call's effect is a counter per key in the user's bucket
//     "effects", written in fn's transaction: it commits with the record or not
//     at all, so after any fault it must be exactly 1 for every done key.
//
// Every answer a caller got is appended to an acks file ("key response").

var effects = []byte("effects")

func workKey(i int) string { return fmt.Sprintf("k%06d", i) }

// ledger is the downstream system of the Do calls.
type ledger struct {
	mu sync.Mutex
	f  *os.File
}

func openLedger(path string) (*ledger, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	return &ledger{f: f}, err
}

func (l *ledger) record(ctx context.Context) error {
	c, _ := idem.CallFrom(ctx)
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, err := fmt.Fprintf(l.f, "%s %d %t\n", c.Key, c.Attempt, c.Recovered); err != nil {
		return err
	}
	return l.f.Sync()
}

// call makes key i's call; onRun, if not nil, is told that fn ran (a DoTx fn
// may run more than once; its effect still commits once).
func call(ctx context.Context, e *idem.Engine, l *ledger, i int) (idem.Result, error) {
	key := workKey(i)
	resp := []byte("r-" + key)
	if i%2 == 0 {
		return e.Do(ctx, key, nil, func(ctx context.Context) ([]byte, error) {
			if err := l.record(ctx); err != nil {
				return nil, idem.Retryable(err)
			}
			return resp, nil
		})
	}
	return e.DoTx(ctx, key, nil, func(_ context.Context, tx *idem.Tx) ([]byte, error) {
		b, err := tx.Bucket(effects)
		if err != nil {
			return nil, err
		}
		var n uint64
		if v := b.Get([]byte(key)); v != nil {
			n = binary.BigEndian.Uint64(v)
		}
		return resp, b.Put([]byte(key), binary.BigEndian.AppendUint64(nil, n+1))
	})
}

// readAcks reads an acks file: key → response. A torn last line (the writer
// died mid-line) is ignored.
func readAcks(t testing.TB, path string) map[string]string {
	t.Helper()
	acks := map[string]string{}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return acks
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), " "); ok && strings.HasPrefix(v, "r-") {
			acks[k] = v
		}
	}
	return acks
}

// verdict is what checkWorkload counted.
type verdict struct {
	keys, acked, reexecuted, recoveredSeen int
}

func (v *verdict) add(o verdict) {
	v.keys += o.keys
	v.acked += o.acked
	v.reexecuted += o.reexecuted
	v.recoveredSeen += o.recoveredSeen
}

// checkWorkload reopens nothing: on e (a reopened engine over what survived
// the fault), it checks every acked answer replays unchanged, retries keys
// 0..n-1 until each has an answer, then checks the effects: every DoTx key's
// counter is exactly 1, and a Do key ran more than once only in an execution
// that saw Recovered (read from the ledger).
func checkWorkload(t testing.TB, e *idem.Engine, l *ledger, ledgerPath string, acks map[string]string, n int) verdict {
	t.Helper()
	ctx := context.Background()
	v := verdict{keys: n, acked: len(acks)}
	for k, want := range acks {
		rec, err := e.Get(k)
		if err != nil {
			t.Errorf("acked key %s: %v", k, err)
			continue
		}
		if rec.State != idem.StateDone || string(rec.Response) != want {
			t.Errorf("acked key %s: record %v %q, acked %q", k, rec.State, rec.Response, want)
		}
	}
	for i := range n {
		res, err := call(ctx, e, l, i)
		if err != nil {
			t.Errorf("retry of %s: %v", workKey(i), err)
			continue
		}
		if want, ok := acks[workKey(i)]; ok && (!res.Replayed || string(res.Response) != want) {
			t.Errorf("acked key %s: retry got %q replayed=%t, acked %q", workKey(i), res.Response, res.Replayed, want)
		}
	}
	if err := e.View(func(tx *bbolt.Tx) error {
		b := tx.Bucket(effects)
		for i := 1; i < n; i += 2 {
			var got uint64
			if b != nil {
				if val := b.Get([]byte(workKey(i))); val != nil {
					got = binary.BigEndian.Uint64(val)
				}
			}
			if got != 1 {
				t.Errorf("DoTx key %s: effect committed %d times, want 1", workKey(i), got)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(ledgerPath)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	runs := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if f := strings.Fields(line); len(f) == 3 {
			runs[f[0]] = append(runs[f[0]], f[2])
		}
	}
	for i := 0; i < n; i += 2 {
		rs := runs[workKey(i)]
		if len(rs) == 0 {
			t.Errorf("Do key %s: no execution reached the ledger", workKey(i))
		}
		for j, rec := range rs {
			if j > 0 {
				v.reexecuted++
				if rec != "true" {
					t.Errorf("Do key %s: execution %d did not see Recovered", workKey(i), j+1)
				} else {
					v.recoveredSeen++
				}
			}
		}
	}
	return v
}
