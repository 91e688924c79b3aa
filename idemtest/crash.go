package idemtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/internal/fault"
	"github.com/idemkit/idem/internal/testkit"
)

// The crash matrix (issue 14): for every failpoint in the code (points.go)
// and every action (SIGKILL, panic, error), a child process of the test
// binary runs concurrent Do and DoTx traffic on many keys, a dispatcher and
// a pruner, and is faulted once at that point; the parent then reopens the
// store, retries every call and checks the contract's promises.

// Actions of the matrix at a point.
const (
	actionKill  = "kill"  // SIGKILL of the child at the point
	actionPanic = "panic" // a panic at the point (recovered by the child's callers when it reaches them)
	actionError = "error" // the point's step fails with an error wrapping fault.ErrInjected
)

var matrixActions = []string{actionKill, actionPanic, actionError}

// Environment of the matrix.
const (
	// EnvMatrixRuns sets how many fired runs each (point, action) cell
	// needs: 1 by default (the CI slice); the long command sets more.
	EnvMatrixRuns = "IDEMTEST_MATRIX_RUNS"
	// EnvMatrixReport names a file the matrix writes its table of runs per
	// cell to (Markdown), for ROBUSTNESS.md.
	EnvMatrixReport = "IDEMTEST_MATRIX_REPORT"

	envMatrix = "IDEMTEST_MATRIX" // the child's matrixRun, as JSON
)

// childMatrix is the role of a matrix child.
const childMatrix = "matrix"

// The matrix's clock and windows: records written by the parent before the
// child starts (at start) have expired by the time the child runs (at
// matrixNow), so that the child's Prune drops them; the child's own records
// live through the whole run.
const (
	matrixRetention = time.Hour
	matrixTopic     = "matrix"
)

var matrixNow = start.Add(2 * matrixRetention)

// matrixRun is one run of a cell, as the child gets it.
type matrixRun struct {
	Point, Action string
	Seed          uint64
	Dir           string // holds the ledgers
	Policy        idemcore.RecoveryPolicy
	Workers       int // pairs of workers walk the same keys at once
	DoKeys        int
	TxKeys        int
	Warm          int // answers before the point is armed
}

// ledger paths of a run: Do's fn appends "key attempt recovered" to one,
// the outbox handler "payload downstreamKey" to the other, each line synced
// before fn or the handler returns.
func (r matrixRun) doLedger() string       { return filepath.Join(r.Dir, "do.ledger") }
func (r matrixRun) deliveryLedger() string { return filepath.Join(r.Dir, "delivered.ledger") }
func (r matrixRun) doKey(i int) string     { return fmt.Sprintf("do-%03d", i) }
func (r matrixRun) txKey(i int) string     { return fmt.Sprintf("tx-%03d", i) }
func (r matrixRun) oldKey(i int) string    { return fmt.Sprintf("old-%03d", i) }
func matrixDeclined(key string) bool       { n, _ := strconv.Atoi(key[len(key)-3:]); return n%5 == 4 }
func (r matrixRun) keys() (do, tx []string) {
	return keyList(r.DoKeys, r.doKey), keyList(r.TxKeys, r.txKey)
}

func keyList(n int, name func(int) string) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = name(i)
	}
	return out
}

// appendLine appends line to the file at path and syncs it: the effect a
// crash cannot take back. Lines are short, so one O_APPEND write is atomic
// beside concurrent writers.
func appendLine(path, line string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(line + "\n"); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func readLines(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if l != "" {
			lines = append(lines, l)
		}
	}
	return lines, nil
}

// matrixOptions are the options of every engine of a run, parent and child.
func (s *suite[T]) matrixOptions(r matrixRun, now func() time.Time) Options {
	return Options{
		Retention: matrixRetention,
		Recovery:  r.Policy,
		Now:       now,
		Outbox: idemcore.OutboxOptions{
			Dispatch:     true,
			PollInterval: time.Millisecond,
			BaseBackoff:  100 * time.Millisecond,
			MaxBackoff:   time.Second,
			Handlers: map[string]idemcore.Handler{matrixTopic: func(ctx context.Context, m idemcore.Message) error {
				return appendLine(r.deliveryLedger(), string(m.Payload)+" "+m.DownstreamKey)
			}},
		},
	}
}

// doFn is Do's fn for key: a synced ledger line (the effect), the point
// do-in-fn, then a payment or a decline.
func (s *suite[T]) doFn(r matrixRun, key string) func(context.Context) ([]byte, error) {
	return func(ctx context.Context) ([]byte, error) {
		call, _ := idemcore.CallFrom(ctx)
		if err := appendLine(r.doLedger(), fmt.Sprintf("%s %d %t", key, call.Attempt, call.Recovered)); err != nil {
			return nil, err
		}
		if err := fault.Err("do-in-fn"); err != nil {
			return nil, err
		}
		if matrixDeclined(key) {
			return nil, idemcore.WithCode(errDeclined, "card_declined")
		}
		return []byte(fmt.Sprintf("paid %s on attempt %d", key, call.Attempt)), nil
	}
}

// txFn is DoTx's fn for key: an effect row of its own (key#nonce: a second
// committed execution would leave a second row), an outbox message, the
// point dotx-in-fn, then a booking or a decline.
func (s *suite[T]) txFn(key string) func(context.Context, T) ([]byte, error) {
	return func(ctx context.Context, tx T) ([]byte, error) {
		if err := s.h.PutEffect(tx, key+"#"+strconv.FormatUint(rand.Uint64(), 36), "1"); err != nil {
			return nil, err
		}
		if err := s.h.Enqueue(tx, matrixTopic, []byte(key)); err != nil {
			return nil, err
		}
		if err := fault.Err("dotx-in-fn"); err != nil {
			return nil, err
		}
		if matrixDeclined(key) {
			return nil, idemcore.WithCode(errDeclined, "card_declined")
		}
		return []byte("booked " + key), nil
	}
}

// report is one line of a matrix child: an event, or a call's end.
type report struct {
	Ev   string `json:"ev"` // "fired", "call", "end"
	Key  string `json:"k,omitempty"`
	Ans  bool   `json:"ans,omitempty"` // the call got an answer (a stored outcome)
	Nil  bool   `json:"nil,omitempty"` // its response was nil
	Resp []byte `json:"r,omitempty"`   // the response, also beside an error
	Att  int    `json:"a,omitempty"`
	Rep  bool   `json:"rep,omitempty"`
	Code string `json:"c,omitempty"`
	Msg  string `json:"m,omitempty"`
	Err  string `json:"e,omitempty"` // no answer: the error, or the panic
	Fire bool   `json:"f,omitempty"` // the point had fired when the call ended
}

// answerOf makes the report of a call's end: an answer if it returned nil or
// an *idem.Error (fn's outcome, stored), else the error, and the response
// the failed call returned beside it (there must be none).
func answerOf(key string, res idemcore.Result, err error) report {
	r := report{Ev: "call", Key: key}
	var ie *idemcore.Error
	switch {
	case err == nil:
		r.Ans = true
	case errors.As(err, &ie):
		r.Ans, r.Code, r.Msg = true, ie.Code, ie.Message
	default:
		r.Err, r.Resp = err.Error(), res.Response
		return r
	}
	r.Nil, r.Resp, r.Att, r.Rep = res.Response == nil, res.Response, res.Attempt, res.Replayed
	return r
}

// same reports whether two answers are the same outcome (the replayed flag
// aside).
func (a report) same(b report) bool {
	return a.Ans && b.Ans && a.Nil == b.Nil && string(a.Resp) == string(b.Resp) && a.Att == b.Att &&
		a.Code == b.Code && a.Msg == b.Msg
}

// matrixChild is a matrix child's part: traffic, the fault, Close, exit.
func matrixChild[T any](t *testing.T, h Harness[T], store string) {
	var r matrixRun
	if err := json.Unmarshal([]byte(os.Getenv(envMatrix)), &r); err != nil {
		fmt.Fprintln(os.Stderr, "idemtest matrix child:", err)
		os.Exit(10)
	}
	s := &suite[T]{h: h}
	out := os.NewFile(3, "idemtest-report")
	var outMu sync.Mutex
	say := func(rep report) {
		b, _ := json.Marshal(rep)
		outMu.Lock()
		defer outMu.Unlock()
		if _, err := out.Write(append(b, '\n')); err != nil {
			os.Exit(8)
		}
	}
	var armed, fired atomic.Bool
	fault.Set(r.Point, func() error {
		if !armed.Load() || !fired.CompareAndSwap(false, true) {
			return nil
		}
		say(report{Ev: "fired"})
		switch r.Action {
		case actionKill:
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		case actionPanic:
			panic(&fault.Panic{Point: r.Point})
		}
		return fmt.Errorf("fault: %s: %w", r.Point, fault.ErrInjected)
	})
	now := func() time.Time { return matrixNow }
	e, err := h.Open(t, store, s.matrixOptions(r, now))
	if err != nil {
		fmt.Fprintln(os.Stderr, "idemtest matrix child: open:", err)
		os.Exit(10)
	}
	doKeys, txKeys := r.keys()
	all := append(append([]string(nil), doKeys...), txKeys...)
	var answers atomic.Int64
	var wg sync.WaitGroup
	for w := range r.Workers {
		// Workers 2i and 2i+1 walk one order of the keys, so that calls
		// meet on a key (waiters, replays); other pairs walk other orders.
		order := append([]string(nil), all...)
		rng := rand.New(rand.NewPCG(r.Seed, uint64(w/2)))
		rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i, key := range order {
				rep := func() (rep report) {
					defer func() {
						if v := recover(); v != nil {
							rep = report{Ev: "call", Key: key, Err: fmt.Sprintf("panic: %v", v)}
						}
					}()
					if strings.HasPrefix(key, "do-") {
						res, err := e.Do(bg, key, fp, s.doFn(r, key))
						return answerOf(key, res, err)
					}
					res, err := e.DoTx(bg, key, fp, s.txFn(key))
					return answerOf(key, res, err)
				}()
				rep.Fire = fired.Load()
				say(rep)
				if rep.Ans && answers.Add(1) == int64(r.Warm) {
					armed.Store(true)
				}
				if w == 0 && armed.Load() && i%8 == 0 {
					func() {
						defer func() { _ = recover() }() // a panic at a prune point
						_, _ = e.Prune(bg)
					}()
				}
			}
		}()
	}
	wg.Wait()
	end := report{Ev: "end"}
	if err := e.Close(); err != nil {
		end.Err = err.Error()
	}
	say(end)
	os.Exit(0)
}

// cellStats are the figures of one (point, action) cell over its runs.
type cellStats struct {
	Point, Action string
	Runs          int // runs in which the point fired
	Unfired       int // runs in which it did not (not counted)
	Killed        int // children that died of SIGKILL
	Died          int // children that died of the panic (on a goroutine no caller recovers)
	Exited        int // children that went on and closed the engine
	Answers       int // answers the children gave
	BeforeFault   int // of them, before the point fired
	Recovered     int // Do re-executions, each with fn seeing Recovered
	Retried       int // calls the parent finished after the fault
	Delivered     int // distinct messages delivered
	Redelivered   int // deliveries beyond the first of a message
	DupEffects    int // DoTx effects committed twice (must stay 0)
	LostAnswers   int // answers not replayed identically (must stay 0)
}

// matrixRuns is how many fired runs a cell needs.
func matrixRuns(t testing.TB) int {
	v := os.Getenv(EnvMatrixRuns)
	if v == "" {
		return 1
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive number", EnvMatrixRuns, v)
	}
	return n
}

// matrix runs the crash matrix: every failpoint the backend's engine reaches
// × {kill, panic, error}.
func (s *suite[T]) matrix(t *testing.T) {
	if !fault.Enabled {
		t.Fatal("idemtest: the crash matrix needs a build with -tags " + fault.Tag + " (run the suite under testkit.Failpoints)")
	}
	points, err := backendPoints()
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(points))
	for name := range points {
		if why, ok := s.h.Unreached[name]; ok {
			t.Logf("crash matrix: no cells for %s (%s:%d): %s", name, points[name].File, points[name].Line, why)
			continue
		}
		names = append(names, name)
	}
	for name := range s.h.Unreached {
		if _, ok := points[name]; !ok {
			t.Errorf("idemtest: Harness.Unreached names %q, which is no failpoint of the code", name)
		}
	}
	sort.Strings(names)
	if len(names) == 0 {
		t.Fatal("idemtest: no failpoints found in the code: the matrix would be empty")
	}
	runs := matrixRuns(t)
	var mu sync.Mutex
	var table []*cellStats
	t.Run("cells", func(t *testing.T) {
		for i, point := range names {
			for j, action := range matrixActions {
				st := &cellStats{Point: point, Action: action}
				mu.Lock()
				table = append(table, st)
				mu.Unlock()
				t.Run(point+"="+action, func(t *testing.T) {
					t.Parallel() // cells share nothing but the server; the suite's hooks are not used
					for run := 0; st.Runs < runs; run++ {
						if run >= runs+2 {
							t.Fatalf("%s=%s: the point fired in %d of %d runs: the traffic does not reach it (%s:%d)",
								point, action, st.Runs, run, points[point].File, points[point].Line)
						}
						r := matrixRun{Point: point, Action: action, Dir: t.TempDir(),
							Seed:    uint64(1000*i + 10*j + run),
							Policy:  []idemcore.RecoveryPolicy{idemcore.RecoverReexecute, idemcore.RecoverRefuse}[(i+j+run)%2],
							Workers: 4, DoKeys: 16, TxKeys: 16, Warm: 6}
						if runs > 1 {
							r.Workers, r.DoKeys, r.TxKeys, r.Warm = 8, 48, 48, 6+run%24
						}
						s.matrixCell(t, r, st)
						if t.Failed() {
							return
						}
					}
				})
			}
		}
	})
	var b strings.Builder
	fmt.Fprintf(&b, "| point | action | runs | not fired | killed | died of the panic | went on | answers (before the fault) | Do re-executions, all Recovered | calls finished after | messages delivered (again) | DoTx effects twice | answers lost |\n")
	fmt.Fprintf(&b, "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	var total cellStats
	for _, c := range table {
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %d | %d | %d | %d (%d) | %d | %d | %d (%d) | %d | %d |\n", c.Point, c.Action, c.Runs, c.Unfired,
			c.Killed, c.Died, c.Exited, c.Answers, c.BeforeFault, c.Recovered, c.Retried, c.Delivered, c.Redelivered, c.DupEffects, c.LostAnswers)
		total.Runs += c.Runs
		total.Unfired += c.Unfired
		total.Killed += c.Killed
		total.Died += c.Died
		total.Exited += c.Exited
		total.Answers += c.Answers
		total.BeforeFault += c.BeforeFault
		total.Recovered += c.Recovered
		total.Retried += c.Retried
		total.Delivered += c.Delivered
		total.Redelivered += c.Redelivered
		total.DupEffects += c.DupEffects
		total.LostAnswers += c.LostAnswers
		if c.Runs == 0 && !t.Failed() {
			t.Errorf("cell %s=%s has zero runs", c.Point, c.Action)
		}
	}
	fmt.Fprintf(&b, "| **all %d cells** | | %d | %d | %d | %d | %d | %d (%d) | %d | %d | %d (%d) | %d | %d |\n", len(table), total.Runs, total.Unfired,
		total.Killed, total.Died, total.Exited, total.Answers, total.BeforeFault, total.Recovered, total.Retried, total.Delivered, total.Redelivered, total.DupEffects, total.LostAnswers)
	t.Logf("crash matrix, %d points × %d actions, %d fired runs per cell:\n%s", len(names), len(matrixActions), runs, b.String())
	if path := os.Getenv(EnvMatrixReport); path != "" {
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Errorf("write %s: %v", path, err)
		}
	}
}

// matrixCell runs one run of a cell: it prepares a store, runs the child,
// and checks what the child left behind; the figures go to st.
func (s *suite[T]) matrixCell(t *testing.T, r matrixRun, st *cellStats) {
	t.Helper()
	store := s.h.New(t)
	clk := newClock()
	// Records that have expired by the child's time, for its Prune.
	e := s.open(t, store, s.matrixOptions(r, clk.Now))
	for i := range 8 {
		if _, err := e.Do(bg, r.oldKey(i), fp, func(context.Context) ([]byte, error) { return []byte("old"), nil }); err != nil {
			t.Fatalf("old record: %v", err)
		}
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}

	reps, how, out := s.runMatrixChild(t, store, r)
	fired := false
	before := map[string][]report{} // answers by key
	var failed []report
	for _, rep := range reps {
		switch {
		case rep.Ev == "fired":
			fired = true
		case rep.Ev == "call" && !rep.Ans:
			failed = append(failed, rep)
		case rep.Ev == "call" && rep.Ans:
			before[rep.Key] = append(before[rep.Key], rep)
			st.Answers++
			if !rep.Fire {
				st.BeforeFault++
			}
		}
	}
	if !fired {
		st.Unfired++
		t.Logf("run with seed %d: %s did not fire (the child %s)", r.Seed, r.Point, how)
		return
	}
	st.Runs++
	switch how {
	case "killed":
		st.Killed++
	case "died":
		st.Died++
	case "exited":
		st.Exited++
	}
	allowed := map[string][]string{actionKill: {"killed"}, actionPanic: {"died", "exited"}, actionError: {"exited"}}[r.Action]
	if !contains(allowed, how) {
		t.Fatalf("%s=%s: the child %s (want %v); it said:\n%s", r.Point, r.Action, how, allowed, out)
	}

	// The parent: reopen as the next process, retry every call.
	if s.h.OwnedAcrossProcesses {
		s.h.ExpireOwners(t, store)
	}
	clk.Advance(matrixNow.Sub(clk.Now()))
	e = s.open(t, store, s.matrixOptions(r, clk.Now))
	doKeys, txKeys := r.keys()
	ev := evidence{Policy: r.Policy, DoKeys: doKeys, TxKeys: txKeys, Before: before, Failed: failed, Final: map[string]report{}}
	var fmu sync.Mutex
	var wg sync.WaitGroup
	keys := append(append([]string(nil), doKeys...), txKeys...)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(keys); i += 4 {
				key := keys[i]
				var res idemcore.Result
				var err error
				if strings.HasPrefix(key, "do-") {
					res, err = e.Do(bg, key, fp, s.doFn(r, key))
				} else {
					res, err = e.DoTx(bg, key, fp, s.txFn(key))
				}
				fmu.Lock()
				ev.Final[key] = answerOf(key, res, err)
				fmu.Unlock()
			}
		}()
	}
	wg.Wait()
	var err error
	if ev.Ledger, err = readLines(r.doLedger()); err != nil {
		t.Fatal(err)
	}
	if ev.Effects, err = s.h.Effects(e); err != nil {
		t.Fatal(err)
	}
	// Wait for the delivery of every committed message (a DoTx answered
	// without an error), advancing the clock past the backoffs, until
	// nothing is pending; then check what was delivered.
	want := map[string]bool{}
	for _, key := range txKeys {
		if f := ev.Final[key]; f.success() {
			want[key] = true
		}
	}
	testkit.Eventually(t, "the delivery of every committed message", func() { clk.Advance(50 * time.Millisecond) }, func() bool {
		lines, err := readLines(r.deliveryLedger())
		if err != nil {
			return false
		}
		got := map[string]bool{}
		for _, l := range lines {
			payload, _, _ := strings.Cut(l, " ")
			got[payload] = true
		}
		for key := range want {
			if !got[key] {
				return false
			}
		}
		return len(messages(t, e)) == 0
	})
	if ev.Deliveries, err = readLines(r.deliveryLedger()); err != nil {
		t.Fatal(err)
	}
	ev.Pending = len(messages(t, e))
	if err := e.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	for _, v := range ev.check(st) {
		t.Error(v)
	}
	if s.h.Check != nil {
		s.h.Check(t, store)
	}
}

// evidence is what a run of a cell leaves, for its check: the answers the
// child got, the parent's retries, the Do ledger, the DoTx effect rows, the
// deliveries and what is left in the outbox.
type evidence struct {
	Policy         idemcore.RecoveryPolicy
	DoKeys, TxKeys []string
	Before         map[string][]report // the child's answers, by key
	Failed         []report            // the child's calls that got no answer
	Final          map[string]report   // the parent's retry of every key
	Ledger         []string            // Do's executions: "key attempt recovered"
	Effects        map[string]string   // DoTx's effect rows: "key#nonce"
	Deliveries     []string            // "payload downstreamKey"
	Pending        int                 // messages left in the outbox
}

// success reports whether a call's answer is fn's success (no error).
func (a report) success() bool { return a.Ans && a.Code == "" && a.Msg == "" }

// check returns every broken promise the evidence shows, and counts the
// run's figures into st:
//   - every retry ends with an answer (under RecoverRefuse, ErrIncomplete for
//     an interrupted Do);
//   - a call that failed (no answer) returned no response: fn's bytes beside
//     an outcome never stored are no answer;
//   - every answer the child got is the answer after the fault, replayed;
//   - Do's fn ran again only where the record was started and the policy
//     allowed it: every execution after a key's first saw Recovered with a
//     higher attempt, none under RecoverRefuse; the stored answer is the last
//     execution's attempt; no answer without an execution;
//   - DoTx: one effect row for a success, none for a declined call;
//   - the outbox: every committed message delivered with its downstream key,
//     none of a DoTx that did not commit, nothing left pending.
func (ev evidence) check(st *cellStats) []string {
	var bad []string
	badf := func(format string, args ...any) { bad = append(bad, fmt.Sprintf(format, args...)) }
	keys := append(append([]string(nil), ev.DoKeys...), ev.TxKeys...)
	for _, f := range ev.Failed {
		if f.Resp != nil {
			badf("%s: the call failed (%s) and returned the response %q beside its error", f.Key, f.Err, f.Resp)
		}
	}
	for _, key := range keys {
		f, ok := ev.Final[key]
		if ok && !f.Ans && f.Resp != nil {
			badf("%s: the retry failed (%s) and returned the response %q beside its error", key, f.Err, f.Resp)
		}
		switch {
		case !ok:
			badf("%s: not retried after the fault", key)
			continue
		case !f.Ans && !(ev.Policy == idemcore.RecoverRefuse && strings.HasPrefix(key, "do-") && strings.Contains(f.Err, idemcore.ErrIncomplete.Error())):
			badf("%s: the retry after the fault failed: %s", key, f.Err)
		}
		if f.Ans && !f.Rep {
			st.Retried++
		}
		for _, a := range ev.Before[key] {
			if !a.same(f) || !f.Rep {
				st.LostAnswers++
				badf("%s: the child was answered %+v, after the fault the answer is %+v", key, a, f)
			}
		}
	}

	execs := map[string][][2]int{} // attempt, recovered (1) by key
	for _, l := range ev.Ledger {
		var key string
		var att int
		var rec bool
		if n, _ := fmt.Sscanf(l, "%s %d %t", &key, &att, &rec); n != 3 {
			badf("ledger line %q", l)
			continue
		}
		x := [2]int{att, 0}
		if rec {
			x[1] = 1
		}
		execs[key] = append(execs[key], x)
	}
	for _, key := range ev.DoKeys {
		ex, f := execs[key], ev.Final[key]
		for i, x := range ex {
			switch {
			case i == 0 && x[1] == 1 && ev.Policy == idemcore.RecoverRefuse:
				badf("%s: executed with Recovered under RecoverRefuse: %v", key, ex)
			case i > 0 && ev.Policy == idemcore.RecoverRefuse:
				badf("%s: executed %d times under RecoverRefuse: %v", key, len(ex), ex)
			case i > 0 && x[1] == 0:
				badf("%s: executed again without Recovered: %v", key, ex)
			case i > 0 && x[0] <= ex[i-1][0]:
				badf("%s: an execution repeats an attempt number: %v", key, ex)
			}
			if i > 0 {
				st.Recovered++
			}
		}
		switch {
		case f.Ans && len(ex) == 0:
			badf("%s: answered %+v, but fn never ran", key, f)
		case f.Ans && ex[len(ex)-1][0] != f.Att:
			badf("%s: the last execution was attempt %d, the stored answer is attempt %d (%v)", key, ex[len(ex)-1][0], f.Att, ex)
		}
	}

	rows := map[string]int{}
	for k := range ev.Effects {
		key, _, _ := strings.Cut(k, "#")
		rows[key]++
	}
	want := map[string]bool{}
	for _, key := range ev.TxKeys {
		f, n := ev.Final[key], 0
		if f.success() {
			n = 1
			want[key] = true
		}
		if rows[key] != n {
			if rows[key] > 1 {
				st.DupEffects++
			}
			badf("%s: %d effect rows with the outcome %+v, want %d", key, rows[key], f, n)
		}
	}

	delivered := map[string]int{}
	for _, l := range ev.Deliveries {
		payload, dk, _ := strings.Cut(l, " ")
		if dk != idemcore.DownstreamKey(payload, 0) {
			badf("the message of %s was delivered with the downstream key %q", payload, dk)
		}
		delivered[payload]++
	}
	for _, key := range ev.TxKeys {
		if want[key] && delivered[key] == 0 {
			badf("the message of %s was lost: its DoTx committed, it was never delivered", key)
		}
	}
	for key, n := range delivered {
		if !want[key] {
			badf("a message of %s was delivered, but its DoTx did not commit", key)
		}
		st.Delivered++
		st.Redelivered += n - 1
	}
	if ev.Pending != 0 {
		badf("%d messages left in the outbox", ev.Pending)
	}
	return bad
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if x == y {
			return true
		}
	}
	return false
}

// runMatrixChild runs a matrix child on store and returns its reports, how
// it ended ("killed", "died" of the injected panic, "exited" after closing
// the engine), and its output. Any other end fails the test.
func (s *suite[T]) runMatrixChild(t *testing.T, store string, r matrixRun) ([]report, string, string) {
	t.Helper()
	if !childMainCalled.Load() {
		t.Fatal("idemtest: call idemtest.ChildMain() first in TestMain: the crash matrix re-executes the test binary")
	}
	cfg, _ := json.Marshal(r)
	c := testkit.Start(t, os.Args[0], []string{"-test.run=" + testkit.Pattern(s.run), "-test.count=1"},
		envChild+"="+childMatrix, envRun+"="+s.run, envStore+"="+store, envMatrix+"="+string(cfg))
	waited := make(chan error, 1)
	go func() { waited <- c.Wait() }()
	var werr error
	select {
	case werr = <-waited:
	case <-time.After(2 * time.Minute): // a bound on a hang (a deadlock is a finding), not a timing claim
		_ = c.Signal(syscall.SIGQUIT) // its goroutines' stacks, for the report
		<-waited
		t.Fatalf("%s=%s: the child hung; it said:\n%s", r.Point, r.Action, c.Output())
	}
	var reps []report
	for _, line := range c.Reports() {
		var rep report
		if err := json.Unmarshal([]byte(line), &rep); err != nil {
			t.Fatalf("report %q: %v", line, err)
		}
		reps = append(reps, rep)
	}
	out := c.Output()
	ended := len(reps) > 0 && reps[len(reps)-1].Ev == "end"
	status, exited := testkit.ExitStatus(werr)
	switch {
	case werr == nil && ended:
		return reps, "exited", out
	case testkit.Killed(werr):
		return reps, "killed", out
	case exited && status == 2 && strings.Contains(out, (&fault.Panic{Point: r.Point}).Error()):
		return reps, "died", out
	}
	t.Fatalf("%s=%s: the child ended with %v; it said:\n%s", r.Point, r.Action, werr, out)
	return nil, "", ""
}
