package robustness

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit"
	"github.com/idemkit/idem/internal/testkit/boltkit"
)

// historyKind classifies a call's answer for testkit.ContractModel.
func historyKind(res idem.Result, err error) (op, resp string) {
	switch {
	case err == nil && res.Replayed:
		return "replay", string(res.Response)
	case err == nil:
		return "exec", string(res.Response)
	case errors.Is(err, idem.ErrRetryable):
		return "free", ""
	}
	return "unknown", ""
}

// historyChild makes calls on IDEM_DB from 8 goroutines until it is killed,
// writing each call's start ("C seq id key own") before it and its end ("R
// seq id op resp") after it to IDEM_HISTORY, with seq from one counter under
// one lock, so the file's order is real time.
func historyChild() {
	// IDEM_NOSYNC (UNSAFE) shows the check catches lost answers.
	e, err := idem.OpenFile(os.Getenv("IDEM_DB"), &idem.BoltOptions{NoSync: os.Getenv("IDEM_NOSYNC") != ""}, &idem.Options{PruneInterval: -1})
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		os.Exit(5)
	}
	h, err := os.OpenFile(os.Getenv("IDEM_HISTORY"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		os.Exit(5)
	}
	var mu sync.Mutex
	seq, next := 0, 0
	line := func(format string, args ...any) {
		mu.Lock()
		seq++
		fmt.Fprintf(h, format, append([]any{seq}, args...)...)
		mu.Unlock()
	}
	for w := range 8 {
		go func() {
			r := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for {
				mu.Lock()
				next++
				id := next
				mu.Unlock()
				key := fmt.Sprintf("h%d", id/8+r.IntN(16))
				own := fmt.Sprintf("r%d", id)
				free := r.IntN(8) == 0
				line("C %d %d %s %s\n", id, key, own)
				res, err := e.Do(context.Background(), key, nil, func(context.Context) ([]byte, error) {
					if free {
						return nil, idem.Retryable(errors.New("nothing happened"))
					}
					return []byte(own), nil
				})
				op, resp := historyKind(res, err)
				line("R %d %d %s %s\n", id, op, resp)
			}
		}()
	}
	select {}
}

// TestHistoryThroughPowerCuts: a child makes concurrent calls on the FUSE
// layer and logs each call's start and end; it is killed at a random moment
// and the power is cut, in each mode of cutModes (ordered: all unsynced
// writes dropped, or a suffix of them in odd rounds; harsh: an arbitrary
// subset kept, torn at sectors, fewer rounds in the short run). The parent
// then calls every key the child touched again, twice, on what survived, and
// checks the whole history per key with porcupine against
// testkit.ContractModel: a call the kill cut short is an unknown outcome that
// took effect before the kill or never; an answer the child got must hold
// afterwards (a lost done record would let the parent execute again: a
// double execution).
func TestHistoryThroughPowerCuts(t *testing.T) {
	forEachCut(t, 3, 2, 3, func(t *testing.T, r *rand.Rand, cuts []cut) {
		var total histStats
		for i, c := range cuts {
			h := checkHistory(t, historyRound(t, r, c, false))
			if t.Failed() {
				t.Fatalf("round %d (%s cut) failed", i, c)
			}
			total.calls += h.calls
			total.pending += h.pending
			total.keys += h.keys
		}
		t.Logf("power cuts: %d; calls checked: %d on %d keys, %d of them cut short by the kill", len(cuts), total.calls, total.keys, total.pending)
	})
}

// TestHistoryCatchesNoSync is the history check's negative, in each mode of
// cutModes: with the child's bbolt commits made with NoSync, a power cut
// must make it fail (a lost answer, a torn file, a double execution) within
// noSyncRounds rounds (see TestPowerCutCatchesNoSync).
func TestHistoryCatchesNoSync(t *testing.T) {
	for _, m := range cutModes {
		t.Run(m.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed(t), 5))
			catchNoSync(t, m, func(c cut) afterCut { return historyRound(t, r, c, true) })
		})
	}
}

// histStats counts what one round of the history test checked.
type histStats struct{ calls, pending, keys int }

// historyRound is one round of the history test up to the cut: the history
// child on the FUSE layer (NoSync with nosync), SIGKILL, a power cut c.
func historyRound(t *testing.T, r *rand.Rand, c cut, nosync bool) afterCut {
	f := mountFaultFS(t)
	a := afterCut{Check: "history", DB: filepath.Join(f.under, "idem.db"), History: filepath.Join(t.TempDir(), "history")}
	env := []string{"IDEM_DB=" + filepath.Join(f.mnt, "idem.db"), "IDEM_HISTORY=" + a.History,
		"IDEM_NOSYNC=" + os.Getenv("IDEM_ROBUST_NOSYNC")}
	if nosync {
		env = append(env, "IDEM_NOSYNC=1")
	}
	cmd := child(t, "history", env...)
	require.NoError(t, cmd.Start())
	want := 200 + r.IntN(2000)
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if fi, err := os.Stat(a.History); err == nil && fi.Size() > int64(want*16) {
			break
		}
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	f.powerCut(t, r, c)
	return a
}

// checkHistory checks what a history round left: the parent's calls on
// every key touched, and porcupine's verdict on the whole history.
func checkHistory(t testing.TB, a afterCut) histStats {
	t.Helper()
	// The child's history: C lines open an operation, R lines close it;
	// a torn last line is dropped, an open operation stays pending.
	type open struct {
		call      int64
		key, own  string
		done      bool
		ret       int64
		op, resp2 string
	}
	ops := map[int]*open{}
	var maxSeq int64
	data, err := os.ReadFile(a.History)
	require.NoError(t, err)
	if i := strings.LastIndexByte(string(data), '\n'); i >= 0 {
		data = data[:i+1] // the kill may have torn the last line
	} else {
		data = nil
	}
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	for sc.Scan() {
		fl := strings.Fields(sc.Text())
		if len(fl) < 4 {
			continue
		}
		seq, err1 := strconv.ParseInt(fl[1], 10, 64)
		id, err2 := strconv.Atoi(fl[2])
		if err1 != nil || err2 != nil {
			continue
		}
		maxSeq = max(maxSeq, seq)
		switch {
		case fl[0] == "C" && len(fl) == 5:
			ops[id] = &open{call: seq, key: fl[3], own: fl[4]}
		case fl[0] == "R" && ops[id] != nil:
			o := ops[id]
			o.done, o.ret, o.op = true, seq, fl[3]
			if len(fl) == 5 {
				o.resp2 = fl[4]
			}
		}
	}
	var history []porcupine.Operation
	touched, pending := map[string]bool{}, 0
	for _, o := range ops {
		touched[o.key] = true
		in, ret := testkit.HistIn{Key: o.key, Op: o.op, Resp: o.resp2}, o.ret
		if !o.done || o.op == "unknown" {
			// Cut short by the kill: took effect before it, or never.
			in, ret = testkit.HistIn{Key: o.key, Op: "unknown", Resp: o.own}, maxSeq+1
			pending++
		}
		history = append(history, porcupine.Operation{ClientId: 0, Input: in, Call: o.call, Return: ret})
	}

	boltkit.Check(t, a.DB)
	e, err := idem.Open(a.DB, &idem.Options{PruneInterval: -1})
	require.NoError(t, err, "the file opens after the power cut")
	defer func() { require.NoError(t, e.Close()) }()
	seq := maxSeq + 2
	for key := range touched {
		for range 2 {
			own := fmt.Sprintf("p%d", seq)
			call := seq
			res, err := e.Do(context.Background(), key, nil, func(context.Context) ([]byte, error) { return []byte(own), nil })
			require.NoError(t, err)
			op, resp := historyKind(res, err)
			history = append(history, porcupine.Operation{ClientId: 1, Input: testkit.HistIn{Key: key, Op: op, Resp: resp}, Call: call, Return: call + 1})
			seq += 2
		}
	}
	res := porcupine.CheckOperationsTimeout(testkit.ContractModel, history, time.Minute)
	require.Equal(t, porcupine.Ok, res, "the history through the power cut is not linearizable")
	return histStats{calls: len(history), pending: pending, keys: len(touched)}
}
