package robustness

import (
	"fmt"
	"os"
	"testing"
)

// needRoot skips a test that needs root (mount, FUSE, a child run as
// nobody) on a machine where the tests do not run as root.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipped: needs root (mount, FUSE, a child as nobody)")
	}
}

// unavailable is for a facility whose preconditions hold (root, the device)
// but that still failed to start (a mount): it skips the test, except under
// CI, where it fails it, so that a robustness test that can run here cannot
// stop running unnoticed.
func unavailable(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("CI") != "" {
		t.Fatalf("CI is set, the preconditions hold, and yet: %s", msg)
	}
	t.Skip("skipped: " + msg)
}
