package fault_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// enginePoints arms every failpoint of the engine to kill the process.
const enginePoints = "do-after-started=kill;do-after-fn=kill;do-after-done=kill;do-wait=kill;" +
	"dotx-before-commit=kill;dotx-after-commit=kill;outbox-after-handler=kill"

// build builds testdata/points with the given go build flags into a
// temporary directory.
func build(t *testing.T, flags ...string) string {
	t.Helper()
	exe := filepath.Join(t.TempDir(), "points")
	args := append(append([]string{"build"}, flags...), "-o", exe, "./testdata/points")
	out, err := exec.Command("go", args...).CombinedOutput()
	require.NoError(t, err, "go %v:\n%s", args, out)
	return exe
}

// runPoints runs exe with IDEM_FAILPOINT=spec and returns its output, its
// exit status (-1 if killed) and the signal that killed it.
func runPoints(t *testing.T, exe, spec string) (string, int, syscall.Signal) {
	t.Helper()
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), "IDEM_FAILPOINT="+spec)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		ws := exit.Sys().(syscall.WaitStatus)
		if ws.Signaled() {
			return string(out), -1, ws.Signal()
		}
		return string(out), ws.ExitStatus(), 0
	}
	require.NoError(t, err)
	return string(out), 0, 0
}

// TestFailpointsOnlyInTaggedBuilds: a program built without the idemfail
// tag passes every failpoint whatever IDEM_FAILPOINT says; the same program
// built with the tag dies, panics, sleeps or fails where it says.
func TestFailpointsOnlyInTaggedBuilds(t *testing.T) {
	untagged := build(t)
	for _, spec := range []string{
		enginePoints + ";points-point=kill;points-err=kill",
		"do-after-fn",
		"do-after-started=panic;points-point=panic;points-err=error",
		"points-point=sleep(20ms)",
		"not a valid spec=explode(",
	} {
		out, code, sig := runPoints(t, untagged, spec)
		require.Equal(t, 0, code, "untagged, IDEM_FAILPOINT=%q:\n%s", spec, out)
		require.Zero(t, sig, "untagged, IDEM_FAILPOINT=%q", spec)
		require.Contains(t, out, "passed every point")
	}

	tagged := build(t, "-tags", "idemfail")
	for _, tc := range []struct {
		name, spec string
		code       int // -1: killed by SIGKILL
		want       string
	}{
		{"nothing armed", "", 0, "passed every point"},
		{"a bare name kills", "do-after-fn", -1, ""},
		{"kill in Do", "do-after-done=kill", -1, ""},
		{"kill in DoTx", "dotx-before-commit=kill", -1, ""},
		{"kill in the dispatcher", "outbox-after-handler=kill", -1, ""},
		{"panic", "points-point=panic", 2, "fault: injected panic at points-point"},
		{"sleep", "points-point=sleep(20ms)", 0, "points-point took at least 20ms: true"},
		{"error at an Err point", "points-err=error", 1, "error: fault: points-err: injected failure"},
		{"error at a Point cannot be returned", "points-point=error", 2, "fault: point points-point cannot return an error"},
		{"several terms", "points-point=sleep(20ms); points-err=error", 1, "points-point took at least 20ms: true"},
		{"unknown action", "points-point=explode", 2, `unknown action "explode"`},
		{"bad duration", "points-point=sleep(soon)", 2, "sleep needs a non-negative duration"},
		{"no name", "=kill", 2, "no point name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, code, sig := runPoints(t, tagged, tc.spec)
			require.Equal(t, tc.code, code, "IDEM_FAILPOINT=%q:\n%s", tc.spec, out)
			if tc.code == -1 {
				require.Equal(t, syscall.SIGKILL, sig)
			}
			require.Contains(t, out, tc.want)
		})
	}
}
