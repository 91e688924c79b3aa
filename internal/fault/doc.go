// Package fault marks the engine's failpoints: the named places where crash
// and robustness tests kill, panic, stall or fail the process.
//
// The points exist only in a build with the idemfail tag
// (go build -tags idemfail, go test -tags idemfail), the way bbolt's gofail
// markers are comments until `gofail enable`. In any other build Point and
// Err are empty functions the compiler inlines away, nothing reads
// IDEM_FAILPOINT, and Enabled is false: a release build cannot be killed
// through the environment.
//
// In a tagged build, IDEM_FAILPOINT arms points when the process starts. Its
// value is a list of name=action terms separated by ';':
//
//	IDEM_FAILPOINT='do-after-fn=kill'
//	IDEM_FAILPOINT='do-after-started=sleep(50ms);dotx-before-commit=error'
//
// The actions:
//
//	kill        SIGKILL the process: no deferred function runs, no buffer is
//	            flushed, as when the OOM killer or an operator strikes
//	panic       panic with a *Panic naming the point
//	sleep(D)    sleep for D, a time.ParseDuration string (50ms, 2s)
//	error       make Err return an error wrapping ErrInjected; a point
//	            marked with Point cannot return one and panics instead
//
// A bare name (IDEM_FAILPOINT=do-after-fn) means name=kill. A malformed
// value stops the process at start with the parse error. Tests in one
// process arm points with Set instead.
//
// The crash matrix (idemtest, ROBUSTNESS.md) is generated from the points in
// the code: it finds every Point and Err call by parsing the source, so a
// point's name must be a string literal, and runs kill, panic and error at
// each. So mark a step of the engine with Err and give its error the path a
// failure of that step takes (a failed commit, a failed delivery, a lost
// answer); the matrix refuses Point outside tests, since its error action
// could not run there.
package fault

import (
	"errors"
	"fmt"
)

// Env is the environment variable that arms failpoints in a build with the
// idemfail tag; see the package documentation for its syntax.
const Env = "IDEM_FAILPOINT"

// Tag is the build tag that compiles the failpoints in.
const Tag = "idemfail"

// ErrInjected is the error an armed error action makes Err return (wrapped
// with the point's name).
var ErrInjected = errors.New("injected failure")

// Panic is the value an armed panic action panics with.
type Panic struct{ Point string }

func (p *Panic) Error() string { return fmt.Sprintf("fault: injected panic at %s", p.Point) }
