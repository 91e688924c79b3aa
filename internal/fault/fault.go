// Package fault marks the crash points of the engine. A test process started
// with IDEM_FAILPOINT=name kills itself with SIGKILL when execution reaches the
// point of that name, so crash tests cut the process exactly there. Unset, a
// point costs one atomic load.
package fault

import (
	"os"
	"sync/atomic"
	"syscall"
)

// Env is the environment variable that arms a failpoint.
const Env = "IDEM_FAILPOINT"

var armed atomic.Pointer[string]

func init() {
	if name := os.Getenv(Env); name != "" {
		armed.Store(&name)
	}
}

// Arm arms the named point in this process ("" disarms).
func Arm(name string) {
	if name == "" {
		armed.Store(nil)
		return
	}
	armed.Store(&name)
}

// Point kills the process with SIGKILL if name is the armed failpoint.
func Point(name string) {
	if p := armed.Load(); p != nil && *p == name {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
}
