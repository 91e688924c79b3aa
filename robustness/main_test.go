package robustness

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/idemkit/idem"
)

// The tests re-execute their own binary as a child (envChild names which);
// the child runs until it is killed.
const envChild = "IDEM_ROBUSTNESS_CHILD"

func TestMain(m *testing.M) {
	switch os.Getenv(envChild) {
	case "":
		os.Exit(m.Run())
	case "workload":
		workloadChild()
	case "open":
		openChild()
	case "hold":
		holdChild()
	case "script":
		scriptChild()
	case "history":
		historyChild()
	default:
		fmt.Fprintf(os.Stderr, "no child %q\n", os.Getenv(envChild))
		os.Exit(3)
	}
	os.Exit(0)
}

// child returns the command that runs the named child of this binary.
func child(t *testing.T, name string, env ...string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), append([]string{envChild + "=" + name}, env...)...)
	return cmd
}

// workloadChild runs the workload on IDEM_DB with 8 goroutines until it is
// killed, appending every answer to IDEM_ACKS and every Do execution to
// IDEM_LEDGER; it stops starting calls at key IDEM_KEYS.
func workloadChild() {
	// IDEM_NOSYNC (UNSAFE) shows that the power-cut test catches lost
	// answers: with it the test fails.
	e, err := idem.OpenFile(os.Getenv("IDEM_DB"), &idem.BoltOptions{NoSync: os.Getenv("IDEM_NOSYNC") != ""}, &idem.Options{PruneInterval: -1})
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		os.Exit(5)
	}
	l, err := openLedger(os.Getenv("IDEM_LEDGER"))
	if err != nil {
		os.Exit(5)
	}
	acks, err := os.OpenFile(os.Getenv("IDEM_ACKS"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		os.Exit(5)
	}
	n, _ := strconv.Atoi(os.Getenv("IDEM_KEYS"))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < n; i += 8 {
				res, err := call(context.Background(), e, l, i)
				if err != nil {
					continue
				}
				mu.Lock()
				fmt.Fprintf(acks, "%s %s\n", workKey(i), res.Response)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	fmt.Println("done")
	select {} // wait for the kill
}

// openChild opens IDEM_DB with the options IDEM_READONLY asks for, replays
// the key "child" and calls the new key "child-new", printing each error (or
// "ok") on stdout and exiting 0: the parent judges the errors.
func openChild() {
	ro := os.Getenv("IDEM_READONLY") != ""
	e, err := idem.OpenFile(os.Getenv("IDEM_DB"), &idem.BoltOptions{ReadOnly: ro}, &idem.Options{PruneInterval: -1})
	if err != nil {
		fmt.Println("open:", err)
		printSentinels(err)
		return
	}
	defer e.Close()
	for _, k := range []string{"child", "child-new"} {
		res, err := e.Do(context.Background(), k, nil, func(context.Context) ([]byte, error) { return []byte("x"), nil })
		if err != nil {
			fmt.Printf("%s: %v\n", k, err)
			printSentinels(err)
			continue
		}
		fmt.Printf("%s: ok replayed=%t\n", k, res.Replayed)
	}
}

// holdChild opens IDEM_DB, says "held" and holds the file until killed.
func holdChild() {
	e, err := idem.Open(os.Getenv("IDEM_DB"), &idem.Options{PruneInterval: -1})
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(5)
	}
	defer e.Close()
	fmt.Println("held")
	select {}
}

// scriptChild opens IDEM_DB and runs the commands read from stdin, one a
// line, answering each with one line on stdout: "do KEY" and "dotx KEY"
// (fn returns "v"; the answer is "ok replayed=BOOL ran=N" or "err ERROR"
// followed by the sentinels it matches), "close" ("closed"). It exits at the
// end of its input. Tests that put the engine on the FUSE layer run it in
// such a child: an engine in the process that serves the FUSE mount can
// deadlock it (a goroutine faulting on the mmap cannot be stopped for the
// garbage collector, which stops the goroutines that would serve the fault).
func scriptChild() {
	e, err := idem.Open(os.Getenv("IDEM_DB"), &idem.Options{PruneInterval: -1})
	if err != nil {
		fmt.Println("err", err)
		os.Exit(5)
	}
	ran := 0
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		op, key, _ := strings.Cut(sc.Text(), " ")
		var res idem.Result
		switch op {
		case "do":
			res, err = e.Do(context.Background(), key, nil, func(context.Context) ([]byte, error) { ran++; return []byte("v"), nil })
		case "dotx":
			res, err = e.DoTx(context.Background(), key, nil, func(context.Context, *idem.Tx) ([]byte, error) { ran++; return []byte("v"), nil })
		case "close":
			fmt.Println("closed", e.Close())
			continue
		}
		if err != nil {
			var is []string
			for name, s := range sentinels {
				if errors.Is(err, s) {
					is = append(is, "is:"+name)
				}
			}
			slices.Sort(is)
			fmt.Printf("err ran=%d %s %v\n", ran, strings.Join(is, " "), err)
			continue
		}
		fmt.Printf("ok replayed=%t ran=%d\n", res.Replayed, ran)
	}
}
