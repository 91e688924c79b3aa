package idemtest

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/idemkit/idem"
)

// goodEvidence is a run that kept every promise: do-000 was interrupted and
// recovered once, do-001 answered before the fault and replayed after it,
// tx-000 committed once and its message was delivered twice, tx-004 was
// declined.
func goodEvidence() evidence {
	paid := report{Ev: "call", Key: "do-001", Ans: true, Resp: []byte("paid do-001 on attempt 1"), Att: 1}
	replayed := paid
	replayed.Rep = true
	return evidence{
		Policy: idem.RecoverReexecute,
		DoKeys: []string{"do-000", "do-001"},
		TxKeys: []string{"tx-000", "tx-004"},
		Before: map[string][]report{"do-001": {paid}},
		Final: map[string]report{
			"do-000": {Ev: "call", Key: "do-000", Ans: true, Resp: []byte("paid do-000 on attempt 2"), Att: 2},
			"do-001": replayed,
			"tx-000": {Ev: "call", Key: "tx-000", Ans: true, Resp: []byte("booked tx-000"), Att: 1},
			"tx-004": {Ev: "call", Key: "tx-004", Ans: true, Nil: true, Att: 1, Code: "card_declined", Msg: "card declined"},
		},
		Ledger:     []string{"do-000 1 false", "do-001 1 false", "do-000 2 true"},
		Effects:    map[string]string{"tx-000#abc": "1"},
		Deliveries: []string{"tx-000 tx-000/0", "tx-000 tx-000/0"},
	}
}

// TestMatrixCheckRejectsBrokenPromises: the matrix's check passes a run that
// kept the contract and rejects each kind of broken promise injected into it.
func TestMatrixCheckRejectsBrokenPromises(t *testing.T) {
	var st cellStats
	if bad := goodEvidence().check(&st); len(bad) != 0 {
		t.Fatalf("a good run is rejected: %v", bad)
	}
	if st.Recovered != 1 || st.Delivered != 1 || st.Redelivered != 1 || st.Retried != 3 {
		t.Fatalf("figures of the good run: %+v", st)
	}
	for _, tc := range []struct {
		name   string
		inject func(ev *evidence)
		want   string
	}{
		{"a double execution without Recovered", func(ev *evidence) {
			ev.Ledger = append(ev.Ledger, "do-001 2 false")
			ev.Final["do-001"] = report{Ans: true, Rep: true, Resp: []byte("paid do-001 on attempt 1"), Att: 2}
		}, "executed again without Recovered"},
		{"a re-execution under RecoverRefuse", func(ev *evidence) {
			ev.Policy = idem.RecoverRefuse
		}, "under RecoverRefuse"},
		{"a repeated attempt number", func(ev *evidence) {
			ev.Ledger = []string{"do-000 1 false", "do-001 1 false", "do-000 1 true"}
			f := ev.Final["do-000"]
			f.Att = 1
			ev.Final["do-000"] = f
		}, "repeats an attempt number"},
		{"a wrong replay", func(ev *evidence) {
			f := ev.Final["do-001"]
			f.Resp = []byte("paid do-001 twice")
			ev.Final["do-001"] = f
		}, "after the fault the answer is"},
		{"an answer lost: executed afresh after it was given", func(ev *evidence) {
			f := ev.Final["do-001"]
			f.Rep = false
			ev.Final["do-001"] = f
		}, "after the fault the answer is"},
		{"a stored answer of an attempt that did not run last", func(ev *evidence) {
			ev.Ledger = ev.Ledger[:2]
		}, "the stored answer is attempt 2"},
		{"an answer without an execution", func(ev *evidence) {
			ev.Ledger = ev.Ledger[1:2]
		}, "fn never ran"},
		{"a retry that fails", func(ev *evidence) {
			ev.Final["do-000"] = report{Key: "do-000", Err: "idem: do \"do-000\": storage failed"}
		}, "the retry after the fault failed"},
		{"a DoTx effect twice", func(ev *evidence) {
			ev.Effects["tx-000#def"] = "1"
		}, "2 effect rows"},
		{"a declined DoTx's effect committed", func(ev *evidence) {
			ev.Effects["tx-004#abc"] = "1"
		}, "1 effect rows"},
		{"a committed message lost", func(ev *evidence) {
			ev.Deliveries = nil
		}, "was lost"},
		{"a message of a DoTx that did not commit", func(ev *evidence) {
			ev.Deliveries = append(ev.Deliveries, "tx-004 tx-004/0")
		}, "did not commit"},
		{"a message delivered with another downstream key", func(ev *evidence) {
			ev.Deliveries[1] = "tx-000 tx-000/1"
		}, "downstream key"},
		{"a message left pending", func(ev *evidence) {
			ev.Pending = 1
		}, "left in the outbox"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev := goodEvidence()
			ev.Final = maps.Clone(ev.Final)
			ev.Effects = maps.Clone(ev.Effects)
			ev.Ledger = slices.Clone(ev.Ledger)
			ev.Deliveries = slices.Clone(ev.Deliveries)
			tc.inject(&ev)
			bad := ev.check(&cellStats{})
			if !slices.ContainsFunc(bad, func(s string) bool { return strings.Contains(s, tc.want) }) {
				t.Fatalf("the check does not report %q: %v", tc.want, bad)
			}
		})
	}
}

// TestScanPointsFindsEveryMarkedPoint: the scan finds the points of
// idemcore by name and refuses a point whose name is not a literal, and
// one marked with fault.Point (the error action could not run there).
func TestScanPointsFindsEveryMarkedPoint(t *testing.T) {
	dirs, err := suiteDirs()
	if err != nil {
		t.Fatal(err)
	}
	sites, err := scanPoints(dirs[0])
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range sites {
		names = append(names, s.Name)
	}
	for _, want := range []string{"do-before-started", "do-after-started", "do-after-fn", "do-after-done", "do-wait", "dotx-before-commit", "dotx-after-commit"} {
		if !slices.Contains(names, want) {
			t.Errorf("the scan of idemcore misses %s: %v", want, names)
		}
	}
	dir := t.TempDir()
	src := "package p\n\nimport \"github.com/idemkit/idem/internal/fault\"\n\nvar name = \"x\"\n\nfunc f() { fault.Point(name) }\n"
	if err := os.WriteFile(filepath.Join(dir, "p.go"), []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := scanPoints(dir); err == nil || !strings.Contains(err.Error(), "p.go:7") {
		t.Fatalf("a point named by a variable: %v", err)
	}
	src = "package p\n\nimport \"github.com/idemkit/idem/internal/fault\"\n\nfunc f() { fault.Point(\"x\") }\n"
	if err := os.WriteFile(filepath.Join(dir, "p.go"), []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := scanPoints(dir); err == nil || !strings.Contains(err.Error(), "fault.Point") {
		t.Fatalf("a point that cannot fail: %v", err)
	}
}

// TestEveryFailpointIsInABackendsMatrix: every failpoint in the repository is
// in a module whose backend runs the crash matrix (the root module's bbolt
// engine, idempg), or in the state machine and this suite, which both run:
// a point anywhere else would have no cell.
func TestEveryFailpointIsInABackendsMatrix(t *testing.T) {
	dirs, err := suiteDirs()
	if err != nil {
		t.Fatal(err)
	}
	repo := filepath.Dir(dirs[1])
	sites, err := scan(repo, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(sites) == 0 {
		t.Fatal("no failpoints in the repository")
	}
	for _, s := range sites {
		mod := moduleDir(filepath.Dir(filepath.Join(repo, s.File)))
		if mod != repo && mod != filepath.Join(repo, "idempg") {
			t.Errorf("%s (%s:%d) is in the module at %s, whose tests do not run the crash matrix", s.Name, s.File, s.Line, mod)
		}
	}
}

// TestRobustnessListsEveryFailpoint: ROBUSTNESS.md's table of the matrix's
// points has a row for every failpoint of the repository, and none for a
// point the code no longer has.
func TestRobustnessListsEveryFailpoint(t *testing.T) {
	dirs, err := suiteDirs()
	if err != nil {
		t.Fatal(err)
	}
	repo := filepath.Dir(dirs[1])
	doc, err := os.ReadFile(filepath.Join(repo, "ROBUSTNESS.md"))
	if err != nil {
		t.Fatal(err)
	}
	sites, err := scan(repo, true)
	if err != nil {
		t.Fatal(err)
	}
	inCode := map[string]bool{}
	for _, s := range sites {
		if inCode[s.Name] {
			continue
		}
		inCode[s.Name] = true
		if !strings.Contains(string(doc), "| `"+s.Name+"` |") {
			t.Errorf("ROBUSTNESS.md's table of points has no row for %s (%s:%d)", s.Name, s.File, s.Line)
		}
	}
	section, _, _ := strings.Cut(string(doc)[strings.Index(string(doc), "## The crash matrix"):], "\nOne run of a cell")
	for _, line := range strings.Split(section, "\n") {
		if name, ok := strings.CutPrefix(line, "| `"); ok {
			name, _, _ = strings.Cut(name, "`")
			if !inCode[name] {
				t.Errorf("ROBUSTNESS.md lists the point %s, which the code does not have", name)
			}
		}
	}
}
