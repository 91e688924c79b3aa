package testkit

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/idemkit/idem/idemcore"
)

// The contract of one idempotency key, as a nondeterministic sequential
// model: the key is done with a response, or not done. A call is one
// operation between its start and its end:
//
//   - "exec": fn ran in this call and the call answered fn's response, not
//     replayed: legal only while the key is not done; the key is then done
//     with that response. Two such answers for one key are a double
//     execution.
//   - "free": the call answered Retryable (its fn's, or its leader's): legal
//     only while the key is not done; nothing changes.
//   - "replay": the call answered a replay: legal only when the key is done
//     with exactly that response.
//   - "unknown": the call ended without an answer (its ctx ended, the engine
//     closed under it, its leader ended without an outcome): if its fn ran
//     and had returned a response, the key may or may not be done with it
//     now; otherwise nothing changed. An interrupted execution is re-executed
//     later (at-least-once), which "exec" allows because the key was not done.
//
// HistIn is one call of a history checked against ContractModel.
type HistIn struct {
	Key  string
	Op   string // "exec", "free", "replay", "unknown"
	Resp string // exec, replay: the answer; unknown: fn's response if it returned one
}

type histState struct {
	done bool
	resp string
}

// ContractModel is the contract of one idempotency key as a porcupine model,
// partitioned by key; the operations are HistIn values.
var ContractModel = (&porcupine.NondeterministicModel{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		for _, op := range h {
			k := op.Input.(HistIn).Key
			byKey[k] = append(byKey[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(byKey))
		for _, ops := range byKey {
			out = append(out, ops)
		}
		return out
	},
	Init: func() []any { return []any{histState{}} },
	Step: func(state, input, _ any) []any {
		s, in := state.(histState), input.(HistIn)
		switch in.Op {
		case "exec":
			if s.done {
				return nil
			}
			return []any{histState{done: true, resp: in.Resp}}
		case "free":
			if s.done {
				return nil
			}
			return []any{s}
		case "replay":
			if !s.done || s.resp != in.Resp {
				return nil
			}
			return []any{s}
		}
		if s.done || in.Resp == "" {
			return []any{s}
		}
		return []any{s, histState{done: true, resp: in.Resp}}
	},
	Equal: func(a, b any) bool { return a.(histState) == b.(histState) },
	DescribeOperation: func(input, _ any) string {
		in := input.(HistIn)
		return fmt.Sprintf("%s %s %q", in.Key, in.Op, in.Resp)
	},
}).ToModel()

// HistOf classifies one Do or DoTx call's answer (res, err) for the history
// of key: a replay, this call's own execution (whose response must be own,
// fn's answer in this call), a key left free (ErrRetryable), or an unknown
// outcome (ran: fn's response if it returned one in this call, else "").
// A fresh answer that is not own, or a permanent error (fn never returns
// one here), fails t.
func HistOf(t testing.TB, key, own string, res idemcore.Result, err error, ran string) HistIn {
	t.Helper()
	in := HistIn{Key: key}
	switch {
	case err == nil && res.Replayed:
		in.Op, in.Resp = "replay", string(res.Response)
	case err == nil:
		in.Op, in.Resp = "exec", string(res.Response)
		if in.Resp != own {
			t.Errorf("%s: a fresh answer %q that is not this call's fn's %q", key, in.Resp, own)
		}
	case errors.Is(err, idemcore.ErrRetryable):
		in.Op = "free"
	default:
		var perm *idemcore.Error
		if errors.As(err, &perm) {
			t.Errorf("%s: unexpected permanent error %v", key, err)
		}
		in.Op, in.Resp = "unknown", ran
	}
	return in
}

// History collects the calls of a history checked against ContractModel,
// from concurrent clients: Stamp before and after each call, Add its
// classified answer (HistOf), Check at the end. The zero value is ready.
type History struct {
	clock  atomic.Int64
	mu     sync.Mutex
	ops    []porcupine.Operation
	counts map[string]int
}

// Stamp returns the history's next logical time, for a call's start or end.
func (h *History) Stamp() int64 { return h.clock.Add(1) }

// Add records a call of client between the stamps begin and end.
func (h *History) Add(client int, begin, end int64, in HistIn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.counts == nil {
		h.counts = map[string]int{}
	}
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Call: begin, Return: end})
	h.counts[in.Op]++
}

// Check fails t unless the history is linearizable against ContractModel
// (what names it), logging where a visualization of a failing one is.
func (h *History) Check(t testing.TB, what string) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	res, info := porcupine.CheckOperationsVerbose(ContractModel, h.ops, 5*time.Minute)
	if res != porcupine.Ok {
		f := filepath.Join(t.TempDir(), "history.html")
		if err := porcupine.VisualizePath(ContractModel, info, f); err == nil {
			t.Logf("visualization: %s", f)
		}
		t.Fatalf("%s is not linearizable against the contract", what)
	}
}

// String sums the history up: its calls and how many of each kind.
func (h *History) String() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return fmt.Sprintf("%d calls (exec %d, replay %d, free %d, unknown %d)",
		len(h.ops), h.counts["exec"], h.counts["replay"], h.counts["free"], h.counts["unknown"])
}
