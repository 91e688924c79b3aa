//go:build idemfail

package fault

import (
	"fmt"
	"maps"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Enabled reports whether this build has failpoints (the idemfail tag).
const Enabled = true

var (
	mu    sync.Mutex
	hooks atomic.Pointer[map[string]func() error]
)

func init() {
	spec := os.Getenv(Env)
	if spec == "" {
		return
	}
	armed, err := Parse(spec)
	if err != nil {
		fmt.Fprintf(os.Stderr, "fault: %s: %v\n", Env, err)
		os.Exit(2)
	}
	for name, hook := range armed {
		Set(name, hook)
	}
}

// Parse reads a value of IDEM_FAILPOINT: name=action terms separated by ';'
// (see the package documentation), and returns a hook per point.
func Parse(spec string) (map[string]func() error, error) {
	armed := map[string]func() error{}
	for term := range strings.SplitSeq(spec, ";") {
		term = strings.TrimSpace(term)
		if term == "" {
			continue
		}
		name, action, ok := strings.Cut(term, "=")
		if !ok {
			action = "kill"
		}
		name, action = strings.TrimSpace(name), strings.TrimSpace(action)
		if name == "" {
			return nil, fmt.Errorf("%q: no point name", term)
		}
		hook, err := parseAction(name, action)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", term, err)
		}
		armed[name] = hook
	}
	return armed, nil
}

func parseAction(name, action string) (func() error, error) {
	switch action {
	case "kill":
		return func() error { Kill(); return nil }, nil
	case "panic":
		return func() error { panic(&Panic{Point: name}) }, nil
	case "error":
		return func() error { return fmt.Errorf("fault: %s: %w", name, ErrInjected) }, nil
	}
	if arg, ok := strings.CutPrefix(action, "sleep("); ok && strings.HasSuffix(arg, ")") {
		d, err := time.ParseDuration(strings.TrimSuffix(arg, ")"))
		if err != nil || d < 0 {
			return nil, fmt.Errorf("sleep needs a non-negative duration such as 50ms, not %q", arg)
		}
		return func() error { time.Sleep(d); return nil }, nil
	}
	return nil, fmt.Errorf("unknown action %q (kill, panic, sleep(D) or error)", action)
}

// Kill kills this process with SIGKILL: no deferred function runs, no buffer
// is flushed.
func Kill() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way
}

// Set makes point name run hook (nil disarms it) and returns a function that
// disarms it again. The hook's error is what Err returns at that point; a
// point marked with Point panics if its hook returns one.
func Set(name string, hook func() error) (unset func()) {
	mu.Lock()
	defer mu.Unlock()
	m := map[string]func() error{}
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

// Point runs the hook armed at name, if any. A point marked with Point
// cannot fail: a hook that returns an error there panics with it.
func Point(name string) {
	if err := Err(name); err != nil {
		panic(fmt.Sprintf("fault: point %s cannot return an error (arm it with kill, panic or sleep): %v", name, err))
	}
}

// Err runs the hook armed at name, if any, and returns its error: nil, or
// for the error action an error wrapping ErrInjected.
func Err(name string) error {
	if m := hooks.Load(); m != nil {
		if hook := (*m)[name]; hook != nil {
			return hook()
		}
	}
	return nil
}
