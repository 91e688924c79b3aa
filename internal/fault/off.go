//go:build !idemfail

package fault

// Enabled reports whether this build has failpoints (the idemfail tag).
const Enabled = false

// Point marks a failpoint at which the process can be killed, panicked or
// stalled. Without the idemfail tag it does nothing.
func Point(name string) {}

// Err marks a failpoint that can also fail: it returns the error an armed
// error action makes (wrapping ErrInjected), else nil. Without the idemfail
// tag it returns nil.
func Err(name string) error { return nil }

// Set arms point name with hook in a build with the idemfail tag. Without
// the tag there are no points to arm: Set panics, so a test that needs a
// failpoint cannot pass without one (testkit.Failpoints runs such a test in
// a tagged build).
func Set(name string, hook func() error) (unset func()) {
	panic("fault: Set needs a build with -tags " + Tag)
}
