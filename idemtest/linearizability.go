package idemtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemcore"
)

// The sequential specification of one idempotency key: absent, claimed by a
// running fn (with its fingerprint), or done with the fingerprint and the
// response of the execution that completed it. A call whose fn ran is two
// operations of the model, claim (up to fn's first start) and complete (from
// fn's last end); a call answered without running fn is one.
type keyState struct {
	claimed, done bool
	fp, resp      string
}

type doInput struct {
	op      string // "claim", "complete" or "do"
	key, fp string
	own     string // complete: the response fn returned, or "" for Retryable
}

type doOutput struct {
	resp string
	kind string // "ok", "mismatch", "retryable"
}

var dedupeModel = porcupine.Model{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		for _, op := range h {
			k := op.Input.(doInput).key
			byKey[k] = append(byKey[k], op)
		}
		var out [][]porcupine.Operation
		for _, ops := range byKey {
			out = append(out, ops)
		}
		return out
	},
	Init: func() any { return keyState{} },
	Step: func(state, input, output any) (bool, any) {
		s, in, out := state.(keyState), input.(doInput), output.(doOutput)
		switch in.op {
		case "claim":
			return !s.claimed && !s.done, keyState{claimed: true, fp: in.fp}
		case "complete":
			if !s.claimed || s.fp != in.fp {
				return false, s
			}
			if in.own == "" {
				return out.kind == "retryable", keyState{}
			}
			return out.kind == "ok" && out.resp == in.own, keyState{done: true, fp: in.fp, resp: in.own}
		}
		switch out.kind {
		case "mismatch":
			return (s.claimed || s.done) && s.fp != in.fp, s
		case "retryable": // a waiter given its leader's Retryable outcome
			return !s.claimed && !s.done, s
		}
		return s.done && s.fp == in.fp && out.resp == s.resp, s
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(doInput), output.(doOutput)
		return fmt.Sprintf("%s(%s, fp=%s, own=%s) -> %s %s", in.op, in.key, in.fp, in.own, out.kind, out.resp)
	},
}

// linearizable runs many concurrent calls on a few keys, with two
// fingerprints and fns that sometimes free the key (Retryable), and checks
// the history against the model with porcupine: every answer is one a single
// sequential dedupe table could have given, in an order consistent with real
// time (STYLE.md: concurrency claims checked against a model of histories).
func (s *suite[T]) linearizable(t *testing.T, v via) {
	e, _ := s.fresh(t, Options{})
	var (
		clock   atomic.Int64
		mu      sync.Mutex
		history []porcupine.Operation
		wg      sync.WaitGroup
		seq     atomic.Int64
	)
	errFree := errors.New("nothing happened")
	for client := range 8 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(client), 9))
			for range 100 {
				key, fp := fmt.Sprintf("k%d", r.IntN(6)), []string{"a", "b"}[r.IntN(10)/9] // mostly "a"
				own := fmt.Sprintf("resp-%d", seq.Add(1))
				if r.IntN(4) == 0 {
					own = "" // fn frees the key
				}
				var fnStart, fnEnd int64
				begin := clock.Add(1)
				res, err := call(bg, e, v, key, []byte(fp), func(context.Context, T) ([]byte, error) {
					if fnStart == 0 { // a DoTx fn may run again: the claim began at its first run
						fnStart = clock.Add(1)
					}
					defer func() { fnEnd = clock.Add(1) }()
					if own == "" {
						return nil, idemcore.Retryable(errFree)
					}
					return []byte(own), nil
				})
				ret := clock.Add(1)
				out := doOutput{kind: "ok", resp: string(res.Response)}
				switch {
				case errors.Is(err, idemcore.ErrFingerprintMismatch):
					out = doOutput{kind: "mismatch"}
				case errors.Is(err, idemcore.ErrRetryable):
					out = doOutput{kind: "retryable"}
				case err != nil:
					t.Errorf("unexpected error: %v", err)
				}
				ops := []porcupine.Operation{{ClientId: client, Input: doInput{op: "do", key: key, fp: fp}, Call: begin, Output: out, Return: ret}}
				if fnStart != 0 { // this call ran fn: claim, then complete
					ops = []porcupine.Operation{
						{ClientId: client, Input: doInput{op: "claim", key: key, fp: fp}, Call: begin, Output: doOutput{}, Return: fnStart},
						{ClientId: client, Input: doInput{op: "complete", key: key, fp: fp, own: own}, Call: fnEnd, Output: out, Return: ret},
					}
				}
				mu.Lock()
				history = append(history, ops...)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	res := porcupine.CheckOperationsTimeout(dedupeModel, history, 30*time.Second)
	require.Equal(t, porcupine.Ok, res, "the history is not linearizable")
}
