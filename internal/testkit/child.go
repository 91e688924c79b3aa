package testkit

// Child processes: the one mechanism by which the repository's tests run code
// in another process (x/sync singleflight_test's executable() and bbolt's
// power-failure test re-exec the test binary the same way). A crash test
// starts a child, lets a failpoint kill it, and reopens the file the child
// left behind.
//
// The child is this package's test binary built with the idemfail tag (the
// failpoints exist only there): when the running binary has the tag it is
// its own child; otherwise `go test -c -tags idemfail` builds one into a
// temporary directory, once per process. A test package that starts
// children calls Main from its TestMain.

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/idemkit/idem/internal/fault"
)

// envChild names the child function a child process runs (Main's map).
const envChild = "IDEM_TESTKIT_CHILD"

var (
	mainCalled bool

	buildMu  sync.Mutex
	buildDir string // holds the tagged binary; Main removes it
	built    string // path of the tagged binary, once built
)

// Main is TestMain's body for a test package that starts child processes.
// In a child started by RunChild it runs the child function named by the
// child's environment with the child's arguments, and exits: with status 4 if
// the function returns (its failpoint was never reached), 3 if no function
// has that name. Otherwise it runs the tests, removes the tagged binary it
// built, if any, and returns m.Run's exit status.
func Main(m *testing.M, children map[string]func(args []string)) int {
	if name := os.Getenv(envChild); name != "" {
		fn := children[name]
		if fn == nil {
			fmt.Fprintf(os.Stderr, "testkit: no child %q in this test binary\n", name)
			os.Exit(3)
		}
		fn(os.Args[1:])
		fmt.Fprintf(os.Stderr, "testkit: child %q returned: it was not killed\n", name)
		os.Exit(4)
	}
	mainCalled = true
	code := m.Run()
	buildMu.Lock()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	buildMu.Unlock()
	return code
}

// TaggedBinary returns the path of this package's test binary built with the
// idemfail tag: the running binary if it has the tag, else one built (once
// per process) with `go test -c -tags idemfail` from the package directory.
// The package's TestMain must call Main.
func TaggedBinary(t testing.TB) string {
	t.Helper()
	if fault.Enabled {
		exe, err := os.Executable()
		if err != nil {
			t.Fatalf("testkit: %v", err)
		}
		return exe
	}
	if !mainCalled {
		t.Fatalf("testkit: this package's TestMain must call testkit.Main to start children")
	}
	buildMu.Lock()
	defer buildMu.Unlock()
	if built != "" {
		return built
	}
	dir, err := os.MkdirTemp("", "idem-child-")
	if err != nil {
		t.Fatalf("testkit: %v", err)
	}
	exe := filepath.Join(dir, "child.test")
	args := []string{"test", "-c", "-vet=off", "-tags", fault.Tag, "-o", exe}
	if raceEnabled {
		// The child keeps the parent's race detector, so tests that run in
		// the tagged build (Failpoints) are checked for races too.
		args = append(args, "-race")
	}
	out, err := exec.Command("go", append(args, ".")...).CombinedOutput()
	if err != nil {
		os.RemoveAll(dir)
		t.Fatalf("testkit: go test -c -tags %s: %v\n%s", fault.Tag, err, out)
	}
	buildDir, built = dir, exe
	return exe
}

// RunChild runs the child function name (an entry of Main's map) in the
// tagged test binary with args, the failpoints armed by failpoints
// (IDEM_FAILPOINT's syntax; "" arms none) and the extra environment env
// (KEY=value), waits for it, and returns its combined output and the error
// of its wait (nil if it exited with status 0).
func RunChild(t testing.TB, name, failpoints string, args []string, env ...string) ([]byte, error) {
	t.Helper()
	cmd := exec.Command(TaggedBinary(t), args...)
	cmd.Env = append(os.Environ(), envChild+"="+name, fault.Env+"="+failpoints)
	cmd.Env = append(cmd.Env, env...)
	return cmd.CombinedOutput()
}

// Killed reports whether err, from RunChild or exec.Cmd.Wait, says the
// process died of SIGKILL.
func Killed(err error) bool {
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		return false
	}
	ws, ok := exit.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// RunKilled runs child name as RunChild does and fails the test unless the
// child died of SIGKILL (at the failpoint failpoints arms).
func RunKilled(t testing.TB, name, failpoints string, args []string, env ...string) {
	t.Helper()
	out, err := RunChild(t, name, failpoints, args, env...)
	if !Killed(err) {
		t.Fatalf("child %s must die of SIGKILL at %s; it ended with %v and said:\n%s", name, failpoints, err, out)
	}
}

// Failpoints lets a test that arms failpoints in its own process (fault.Set)
// run under the README's untagged test command. In a build with the idemfail
// tag it returns true and the test goes on. Otherwise it runs this one test
// in the tagged test binary, fails t if the test fails there (with the
// child's output), and returns false: the caller returns at once, its body
// having run in the child.
//
//	if !testkit.Failpoints(t) {
//		return
//	}
func Failpoints(t *testing.T) bool {
	t.Helper()
	if fault.Enabled {
		return true
	}
	args := []string{"-test.run=" + Pattern(t.Name()), "-test.count=1", "-test.v"}
	if testing.Short() {
		args = append(args, "-test.short")
	}
	cmd := exec.Command(TaggedBinary(t), args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s in a build with -tags %s: %v\n%s", t.Name(), fault.Tag, err, out)
	}
	if !strings.Contains(string(out), "--- PASS: "+t.Name()+" (") {
		t.Fatalf("%s did not pass in the build with -tags %s (not run, or skipped):\n%s", t.Name(), fault.Tag, out)
	}
	t.Logf("ran in a build with -tags %s: passed", fault.Tag)
	return false
}
