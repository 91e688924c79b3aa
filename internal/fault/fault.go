// Package fault marks the crash points of the engine. A test process started
// with IDEM_FAILPOINT=name kills itself with SIGKILL when execution reaches the
// point of that name, so crash tests cut the process exactly there. Tests in
// one process can instead run a hook at a point (Set). With nothing armed, a
// point costs one atomic load.
package fault

import (
	"maps"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
)

// Env is the environment variable that arms a failpoint: IDEM_FAILPOINT=name.
const Env = "IDEM_FAILPOINT"

var (
	mu    sync.Mutex
	hooks atomic.Pointer[map[string]func()]
)

func init() {
	if name := os.Getenv(Env); name != "" {
		Set(name, Kill)
	}
}

// Kill kills this process with SIGKILL: no deferred function runs, no buffer
// is flushed, as when the machine's OOM killer or an operator strikes.
func Kill() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way
}

// Set makes point name run hook (nil removes it) and returns a function that
// removes it again.
func Set(name string, hook func()) (unset func()) {
	mu.Lock()
	defer mu.Unlock()
	m := map[string]func(){}
	if old := hooks.Load(); old != nil {
		m = maps.Clone(*old)
	}
	if hook == nil {
		delete(m, name)
	} else {
		m[name] = hook
	}
	hooks.Store(&m)
	return func() { Set(name, nil) }
}

// Point runs the hook set for name, if any.
func Point(name string) {
	if m := hooks.Load(); m != nil {
		if hook := (*m)[name]; hook != nil {
			hook()
		}
	}
}
