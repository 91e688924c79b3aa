package testkit

// Spawned children: a child process of the test binary that runs alongside
// its parent, reporting its progress one line at a time on file descriptor 3
// (the parent waits for a line, then kills it), and that exits as soon as its
// parent goes away (its standard input closes: WatchParent). idemtest's
// process cases and crash matrix run their children this way.

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Pattern is the -test.run pattern that selects exactly the test named name
// (a path of subtests, as t.Name gives it).
func Pattern(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}

// WatchParent makes a child started by Start exit with status 7 as soon as
// its standard input closes: its parent died, or waited for it.
func WatchParent() {
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(7)
	}()
}

// Report is, in a child started by Start, the file its report lines go to
// (file descriptor 3).
func Report() *os.File { return os.NewFile(3, "testkit-report") }

// Child is a child process started by Start.
type Child struct {
	t     testing.TB
	cmd   *exec.Cmd
	out   SyncBuffer
	stdin io.WriteCloser

	mu      sync.Mutex
	reports []string
	more    chan struct{} // closed and replaced at each new report line
	eof     bool

	read   chan struct{} // closed once the reports ended
	waited bool
	next   int // the index of the report Next returns
}

// Start starts exe with args and the extra environment env (KEY=value), its
// output captured (Output), its report lines read from file descriptor 3
// (Await, Reports) and its standard input held open (see WatchParent). The
// child is killed and waited for when t ends, if it still runs.
func Start(t testing.TB, exe string, args []string, env ...string) *Child {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	c := &Child{t: t, cmd: exec.Command(exe, args...), more: make(chan struct{}), read: make(chan struct{})}
	c.cmd.Env = append(os.Environ(), env...)
	c.cmd.Stdout, c.cmd.Stderr = &c.out, &c.out
	c.cmd.ExtraFiles = []*os.File{w}
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	_ = w.Close() // the child holds the write end now: EOF when it dies
	go func() {
		defer close(c.read)
		defer r.Close()
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			c.mu.Lock()
			c.reports = append(c.reports, sc.Text())
			close(c.more)
			c.more = make(chan struct{})
			c.mu.Unlock()
		}
		c.mu.Lock()
		c.eof = true
		close(c.more)
		c.mu.Unlock()
	}()
	t.Cleanup(func() {
		if !c.waited {
			_ = c.cmd.Process.Kill()
			_ = c.Wait()
		}
	})
	return c
}

// Await waits until the child reports line; it fails the test if the child
// ends first, or reports nothing of the kind for a minute.
func (c *Child) Await(line string) {
	c.t.Helper()
	timeout := time.After(time.Minute) // a bound on a hang, not a timing claim
	for seen := 0; ; {
		c.mu.Lock()
		got, eof, more := c.reports[seen:], c.eof, c.more
		seen = len(c.reports)
		c.mu.Unlock()
		for _, l := range got {
			if l == line {
				return
			}
		}
		if eof {
			c.t.Fatalf("the child ended before it reported %q; it said:\n%s", line, c.Output())
		}
		select {
		case <-more:
		case <-timeout:
			c.t.Fatalf("the child did not report %q; it said:\n%s", line, c.Output())
		}
	}
}

// Next returns the child's next report line, in order; it fails the test if
// the child ends first, or says nothing for a minute.
func (c *Child) Next() string {
	c.t.Helper()
	timeout := time.After(time.Minute) // a bound on a hang, not a timing claim
	for {
		c.mu.Lock()
		n, eof, more := len(c.reports), c.eof, c.more
		if c.next < n {
			line := c.reports[c.next]
			c.next++
			c.mu.Unlock()
			return line
		}
		c.mu.Unlock()
		if eof {
			c.t.Fatalf("the child ended without a word; it said:\n%s", c.Output())
		}
		select {
		case <-more:
		case <-timeout:
			c.t.Fatalf("no word from the child; it said:\n%s", c.Output())
		}
	}
}

// Send writes line and a newline to the child's standard input.
func (c *Child) Send(line string) {
	c.t.Helper()
	if _, err := io.WriteString(c.stdin, line+"\n"); err != nil {
		c.t.Fatalf("write to the child: %v", err)
	}
}

// Pid is the child's process id.
func (c *Child) Pid() int { return c.cmd.Process.Pid }

// Kill kills the child with SIGKILL and fails the test unless it died of it.
func (c *Child) Kill() {
	c.t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		c.t.Fatalf("kill the child: %v", err)
	}
	if err := c.Wait(); !Killed(err) {
		c.t.Fatalf("the child must die of SIGKILL; it ended with %v and said:\n%s", err, c.Output())
	}
}

// Signal sends sig to the child.
func (c *Child) Signal(sig os.Signal) error { return c.cmd.Process.Signal(sig) }

// Wait waits for the child to exit and its reports to end, then closes its
// standard input, and returns the error of its wait (an *exec.ExitError for
// a status other than 0 or a signal).
func (c *Child) Wait() error {
	c.waited = true
	err := c.cmd.Wait()
	<-c.read
	_ = c.stdin.Close()
	return err
}

// Reports returns the lines the child reported so far.
func (c *Child) Reports() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.reports...)
}

// Output returns what the child wrote to its standard output and error.
func (c *Child) Output() string { return c.out.String() }

// ExitStatus returns err's exit status, from Wait, and whether the process
// exited (rather than being killed by a signal).
func ExitStatus(err error) (int, bool) {
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		return 0, err == nil
	}
	ws, ok := exit.Sys().(syscall.WaitStatus)
	return ws.ExitStatus(), ok && ws.Exited()
}

// SyncBuffer is a bytes.Buffer safe for concurrent writers and readers: a
// child's output, a slog handler's under the engine's goroutines. The zero
// value is ready.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns what was written.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
