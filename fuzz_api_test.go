package idem_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit"
)

// apiRecord is the model's record of a key: what a sequential engine that
// keeps the contract holds.
type apiRecord struct {
	done      bool
	fp        string
	resp      string
	code, msg string // a stored permanent error
	attempt   int
	at        time.Time // completion (done) or start (started)
}

// FuzzAPI drives the public API with a fuzzed sequence of operations, two
// bytes each (operation, argument): Do and DoTx with a fingerprint and an
// outcome of fn (a response, Retryable, a permanent error, or an interruption:
// fn's context ends and fn returns its error), Forget, Resolve, Prune, clock
// moves (a minute, or past the retention window) and a reopen of the file,
// and checks every answer against a model of the contract. Do keys and DoTx
// keys are kept apart (a DoTx on an interrupted Do record is the conformance
// suite's). The clock only moves forward here: backward jumps are
// TestClockJumps's. CI runs the seed corpus; `go test -run '^$' -fuzz
// FuzzAPI -fuzztime 10m .` is the long run.
func FuzzAPI(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 1, 4, 8, 0, 0, 1})
	f.Add([]byte{0, 3, 0, 0, 7, 0, 0, 1, 0, 3, 5, 0, 0, 0})
	f.Add([]byte{1, 0, 1, 0, 1, 2, 1, 3, 3, 1, 6, 0, 1, 1, 8, 0, 3, 1})
	f.Add([]byte{0, 2, 0, 2, 0, 6, 7, 1, 0, 0, 2, 0, 4, 0, 3, 0, 7, 0, 0, 0})
	f.Add([]byte{0, 3, 8, 0, 4, 0, 0, 1, 7, 1, 6, 0, 0, 0, 2, 1, 2, 0})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 400 {
			ops = ops[:400]
		}
		const ret = time.Hour
		clock := testkit.NewClock(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
		path := filepath.Join(t.TempDir(), "idem.db")
		file, opts := &idem.BoltOptions{NoSync: true}, &idem.Options{Now: clock.Now, Retention: ret, PruneInterval: -1}
		e, err := idem.OpenFile(path, file, opts)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = e.Close() }()
		model := map[string]*apiRecord{}
		live := func(k string) *apiRecord {
			// An expired record stays in the model (Forget may still find
			// it), but is absent to every reader.
			r := model[k]
			if r == nil || !clock.Now().Before(r.at.Add(ret)) {
				return nil
			}
			return r
		}
		for i := 0; i+1 < len(ops); i += 2 {
			op, arg := ops[i]%9, ops[i+1]
			key := fmt.Sprintf("d%d", arg%3)
			fp := []string{"a", "b"}[(arg>>2)%2]
			outcome := (arg >> 3) % 4
			step := fmt.Sprintf("step %d (op %d arg %d) on %s", i/2, op, arg, key)
			switch op {
			case 0, 1: // Do, DoTx
				tx := op == 1
				if tx {
					key = "t" + key[1:]
				}
				want := live(key)
				resp := fmt.Sprintf("r%d", i)
				ran, recovered, attempt := false, false, 0
				ctx, cancel := context.WithCancel(context.Background())
				fn := func(ctx context.Context) ([]byte, error) {
					ran = true
					c, _ := idem.CallFrom(ctx)
					recovered, attempt = c.Recovered, c.Attempt
					switch outcome {
					case 1:
						return nil, idem.Retryable(errors.New("nothing happened"))
					case 2:
						return nil, idem.WithCode(errors.New("declined"), "card_declined")
					case 3:
						cancel()
						return nil, ctx.Err()
					}
					return []byte(resp), nil
				}
				var res idem.Result
				if tx {
					res, err = e.DoTx(ctx, key, []byte(fp), func(ctx context.Context, _ *idem.Tx) ([]byte, error) { return fn(ctx) })
				} else {
					res, err = e.Do(ctx, key, []byte(fp), fn)
				}
				cancel()
				switch {
				case want != nil && want.fp != fp:
					if !errors.Is(err, idem.ErrFingerprintMismatch) || ran {
						t.Fatalf("%s: want a fingerprint mismatch, got %v (fn ran: %t)", step, err, ran)
					}
					continue
				case want != nil && want.done:
					if ran || !res.Replayed {
						t.Fatalf("%s: want a replay, fn ran %t, replayed %t", step, ran, res.Replayed)
					}
					checkAnswer(t, step, want, res, err)
					continue
				}
				if !ran {
					t.Fatalf("%s: fn did not run (err %v)", step, err)
				}
				wantAttempt, wantRecovered := 1, false
				if want != nil { // an interrupted execution
					wantAttempt, wantRecovered = want.attempt+1, true
				}
				if attempt != wantAttempt || recovered != wantRecovered {
					t.Fatalf("%s: fn saw attempt %d recovered %t, want %d %t", step, attempt, recovered, wantAttempt, wantRecovered)
				}
				next := &apiRecord{done: true, fp: fp, attempt: wantAttempt, at: clock.Now()}
				switch outcome {
				case 0:
					next.resp = resp
				case 1:
					if !errors.Is(err, idem.ErrRetryable) {
						t.Fatalf("%s: want ErrRetryable, got %v", step, err)
					}
					// With no live record, nothing changes (an expired one
					// Prune has not reached stays: Forget may find it).
					if want != nil {
						// fn's promise covers its own attempt only: the
						// earlier one's effect is still unknown, so this
						// attempt's started record stays.
						model[key] = &apiRecord{fp: fp, attempt: wantAttempt, at: clock.Now()}
					}
					continue
				case 2:
					next.code, next.msg = "card_declined", "declined"
				case 3:
					if !errors.Is(err, context.Canceled) {
						t.Fatalf("%s: want context.Canceled, got %v", step, err)
					}
					if !tx { // DoTx stores nothing
						model[key] = &apiRecord{fp: fp, attempt: wantAttempt, at: clock.Now()}
					}
					continue
				}
				if res.Replayed {
					t.Fatalf("%s: the first answer says replayed", step)
				}
				checkAnswer(t, step, next, res, err)
				model[key] = next
			case 2: // Forget
				stored := model[key] != nil // live, or expired and perhaps not pruned
				delete(model, key)
				want := live(key)
				err := e.Forget(key)
				if want == nil {
					// Forget deletes an expired record that Prune has not
					// reached yet, and says nil (ROBUSTNESS.md: a finding).
					if !errors.Is(err, idem.ErrNotFound) && (err != nil || !stored) {
						t.Fatalf("%s: Forget of nothing: %v", step, err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("%s: Forget: %v", step, err)
				}
			case 3: // Resolve
				want := live(key)
				err := e.Resolve(key, []byte("resolved"), nil)
				switch {
				case want == nil:
					if !errors.Is(err, idem.ErrNotFound) {
						t.Fatalf("%s: Resolve of nothing: %v", step, err)
					}
				case want.done:
					if !errors.Is(err, idem.ErrState) {
						t.Fatalf("%s: Resolve of a done record: %v", step, err)
					}
				default:
					if err != nil {
						t.Fatalf("%s: Resolve: %v", step, err)
					}
					want.done, want.resp, want.at = true, "resolved", clock.Now()
				}
			case 4: // Prune
				if _, err := e.Prune(context.Background()); err != nil {
					t.Fatalf("%s: Prune: %v", step, err)
				}
			case 5:
				clock.Advance(time.Minute)
			case 6:
				clock.Advance(ret + time.Minute)
			case 7: // reopen
				if err := e.Close(); err != nil {
					t.Fatalf("%s: Close: %v", step, err)
				}
				if e, err = idem.OpenFile(path, file, opts); err != nil {
					t.Fatalf("%s: reopen: %v", step, err)
				}
			case 8: // Get agrees with the model on every key
				for _, k := range []string{"d0", "d1", "d2", "t0", "t1", "t2"} {
					want := live(k)
					rec, err := e.Get(k)
					if want == nil {
						if !errors.Is(err, idem.ErrNotFound) {
							t.Fatalf("%s: Get %s: want nothing, got %v %v", step, k, rec, err)
						}
						continue
					}
					if err != nil || (rec.State == idem.StateDone) != want.done || string(rec.Response) != want.resp || rec.Attempt != want.attempt {
						t.Fatalf("%s: Get %s: got %+v %v, want %+v", step, k, rec, err, want)
					}
				}
			}
		}
	})
}

// checkAnswer compares a call's answer with the record it must come from.
func checkAnswer(t *testing.T, step string, want *apiRecord, res idem.Result, err error) {
	t.Helper()
	if want.code == "" && want.msg == "" {
		if err != nil || string(res.Response) != want.resp {
			t.Fatalf("%s: got %q %v, want %q", step, res.Response, err, want.resp)
		}
		return
	}
	var ie *idem.Error
	if !errors.As(err, &ie) || ie.Code != want.code || ie.Message != want.msg {
		t.Fatalf("%s: got %v, want the stored error %s: %s", step, err, want.code, want.msg)
	}
}
