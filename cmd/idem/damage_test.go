package main

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

const envCLIChild = "IDEM_TEST_CLI_CHILD"

// TestCLIChild is the child side of the tests below: it runs the command
// line in $IDEM_TEST_CLI_CHILD (separated by the unit separator, U+001F) and exits with its status.
func TestCLIChild(t *testing.T) {
	args := os.Getenv(envCLIChild)
	if args == "" {
		t.Skip("runs only as the child of a test that re-executes the test binary")
	}
	os.Exit(run(context.Background(), strings.Split(args, "\x1f"), os.Getenv, os.Stdin, os.Stdout, os.Stderr))
}

// runChild runs the tool in a child process (a fault would kill the test
// binary itself) and returns how it ended: its exit status, and the signal
// that killed it, if one did.
func runChild(t *testing.T, args []string) (code int, sig syscall.Signal, out string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCLIChild$")
	cmd.Env = append(os.Environ(), envCLIChild+"="+strings.Join(args, "\x1f"))
	b, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		ws, _ := exit.Sys().(syscall.WaitStatus)
		if ws.Signaled() {
			return -1, ws.Signal(), firstLines(b)
		}
		return ws.ExitStatus(), 0, string(b)
	}
	require.NoError(t, err)
	return 0, 0, string(b)
}

func firstLines(b []byte) string {
	lines := strings.Split(string(b), "\n")
	return strings.Join(lines[:min(len(lines), 12)], "\n")
}

// A file truncated below its last page in use: every command reports it in
// one line, exit status 1, and none dies of a signal (bbolt maps the file and
// faults, SIGBUS, on the pages past its end).
func TestTruncatedFileIsReportedByEveryCommand(t *testing.T) {
	t.Parallel()
	good, err := os.ReadFile(fixture(t))
	require.NoError(t, err)
	le := binary.LittleEndian
	pageSize := uint64(le.Uint32(good[16+8:]))
	hwm := max(le.Uint64(good[16+40:]), le.Uint64(good[pageSize+16+40:])) // pages in use, by either meta page
	for _, size := range []uint64{8 << 10, (hwm - 1) * pageSize} {
		path := t.TempDir() + "/idem.db"
		require.NoError(t, os.WriteFile(path, good[:size], 0o600))
		cmds := allCommands(path)
		cmds["outbox ls"] = []string{"--db", path, "outbox", "ls"}
		cmds["outbox get"] = []string{"--db", path, "outbox", "get", "1"}
		cmds["json stats"] = []string{"--db", path, "--json", "stats"}
		names := make([]string, 0, len(cmds))
		for name := range cmds {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			code, sig, out := runChild(t, cmds[name])
			require.Zero(t, sig, "idem %s on a file truncated to %d bytes died of %v:\n%s", name, size, sig, out)
			// The Go runtime reports a fault in Go code (SIGBUS, SIGSEGV) as
			// "fatal error: fault ... [signal SIGBUS ...]" and exit status 2.
			require.NotContains(t, out, "[signal ", "idem %s on a file truncated to %d bytes died of a fault:\n%s", name, size, firstLines([]byte(out)))
			require.Equal(t, 1, code, "idem %s: %s", name, out)
			require.Contains(t, out, "damaged", "idem %s", name)
			require.Contains(t, out, "truncated", "idem %s", name)
			if name == "check" {
				require.Contains(t, out, "FAILED: "+path+" has 1 page-level error\n", "check diagnoses the file")
				continue
			}
			if name == "json stats" {
				// --json adds the error as a JSON document on stdout.
				require.Contains(t, out, `"kind": "corrupt"`, "idem %s", name)
				continue
			}
			require.Equal(t, 1, strings.Count(strings.TrimSpace(out), "\n")+1, "idem %s: one line: %s", name, out)
		}
	}
}
