package mcpproxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
	"time"
)

// child is one server process.
type child struct {
	gen    int // 1 for the first, one more for each restart
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	wmu    sync.Mutex
	ctx    context.Context // ends when the process died
	cancel context.CancelFunc
	exited chan struct{} // closed after Wait
	status error         // Wait's error, once exited is closed

	// requests are the ids of its requests to the client not yet answered
	// (under the session's lock).
	requests map[string]bool
	// live: installed as the session's server (after its handshake, for a
	// restarted one). Under the session's lock.
	live bool
}

// start starts server generation gen and the goroutine that reads it.
func (s *session) start(gen int) (*child, error) {
	cmd := exec.Command(s.p.Command[0], s.p.Command[1:]...)
	cmd.Env = s.p.Env
	cmd.Stderr = s.stderr
	setPdeathsig(cmd)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &child{gen: gen, cmd: cmd, stdin: stdin, ctx: ctx, cancel: cancel,
		exited: make(chan struct{}), requests: map[string]bool{}}
	// Pdeathsig fires when the thread that started the child exits, not the
	// process (Go issue 27505): start it from a locked thread that stays
	// until the child has exited.
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		err := cmd.Start()
		started <- err
		if err == nil {
			<-c.exited
		}
	}()
	if err := <-started; err != nil {
		cancel()
		return nil, fmt.Errorf("mcp-proxy: starting the server: %w", err)
	}
	go s.readChild(c, stdout)
	return c, nil
}

// install makes c the session's live server.
func (s *session) install(c *child) {
	s.mu.Lock()
	s.child, c.live = c, true
	close(s.ready)
	s.mu.Unlock()
}

// send writes one message to the server; a failed write is the server's
// death, which readChild handles.
func (c *child) send(msg []byte) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	buf := make([]byte, 0, len(msg)+1)
	buf = append(append(buf, msg...), '\n')
	_, _ = c.stdin.Write(buf)
}

// readChild relays the server's messages until its stdout ends, then waits
// for the process and handles its death.
func (s *session) readChild(c *child, stdout io.Reader) {
	r := bufio.NewReader(stdout)
	for {
		line, err := r.ReadBytes('\n')
		if msg := bytes.TrimSpace(line); len(msg) > 0 {
			s.fromChild(c, msg)
		}
		if err != nil {
			break
		}
	}
	c.status = c.cmd.Wait()
	if c.status == nil {
		c.status = errors.New("exit status 0")
	}
	close(c.exited)
	s.died(c)
}

// died handles the end of server c: the calls waiting for it fail, the
// relayed requests it did not answer get CodeServerDied, and a live server
// of an initialized session is restarted.
//
// The session forgets c before c's context ends: a protected call that sees
// it end runs again on the server liveChild gives it, which must not be c.
func (s *session) died(c *child) {
	s.mu.Lock()
	wasLive := c.live
	if s.child == c {
		s.child, s.ready = nil, make(chan struct{})
	}
	c.cancel() // under the lock: no liveChild between the two

	var orphans []string
	for k, pd := range s.pending {
		if pd.gen == c.gen {
			orphans = append(orphans, k)
			delete(s.pending, k)
		}
	}
	closing, initialized := s.closing, s.initialized
	s.mu.Unlock()
	for _, k := range orphans {
		s.writeClient(errorResponse([]byte(k), CodeServerDied, TypeServerDied,
			fmt.Sprintf("the server process died (%v) before answering; the request was not retried", c.status), nil))
	}
	switch {
	case closing || !wasLive:
		// The end of the session, or a restart's handshake, which reports.
	case !initialized:
		s.fail(fmt.Errorf("mcp-proxy: the server exited before the session was initialized (%v): not restarting it", c.status))
	default:
		s.warn("the server process died (%v): restarting it", c.status)
		s.restart(c.gen + 1)
	}
}

// restart starts server generation gen and replays the client's
// initialization to it before it takes messages.
func (s *session) restart(gen int) {
	c, err := s.start(gen)
	if err != nil {
		s.fail(err)
		return
	}
	s.mu.Lock()
	initReq, initNote := s.initReq, s.initNote
	s.mu.Unlock()
	if initReq != nil {
		if err := s.handshake(c, initReq); err != nil {
			s.killProcess(c)
			s.fail(fmt.Errorf("mcp-proxy: the restarted server failed its initialization: %w", err))
			return
		}
	}
	if initNote != nil {
		c.send(initNote)
	}
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		s.killProcess(c)
		return
	}
	s.mu.Unlock()
	s.install(c)
}

// handshake sends the client's initialize request to c under an id of the
// proxy's own and waits for a result.
func (s *session) handshake(c *child, initReq []byte) error {
	o, err := parseObject(initReq)
	if err != nil {
		return err
	}
	iid := internalPrefix + fmt.Sprint(s.nextID.Add(1))
	ch := s.expect(iid)
	defer s.unexpect(iid)
	c.send(o.set("id", jsonString(iid)).bytes())
	t := time.NewTimer(initTimeout)
	defer t.Stop()
	select {
	case resp := <-ch:
		var m struct {
			Error *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(resp, &m); err != nil {
			return err
		}
		if m.Error != nil {
			return fmt.Errorf("initialize: %s", m.Error.Message)
		}
		return nil
	case <-c.exited:
		return fmt.Errorf("it exited (%v)", c.status)
	case <-t.C:
		return fmt.Errorf("no answer to initialize in %v", initTimeout)
	case <-s.done:
		return s.err()
	}
}

// shutdown ends the session after the client's EOF: protected calls finish
// and are recorded, then the server's stdin is closed and it is given
// stopGrace to exit, then SIGTERM and stopGrace, then SIGKILL.
func (s *session) shutdown(ctx context.Context) {
	waited := make(chan struct{})
	go func() { s.calls.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-ctx.Done():
		s.fail(ctx.Err())
		return
	case <-s.done:
		return
	}
	s.mu.Lock()
	s.closing = true
	c := s.child
	s.mu.Unlock()
	if c == nil {
		return
	}
	c.wmu.Lock()
	_ = c.stdin.Close()
	c.wmu.Unlock()
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		t := time.NewTimer(stopGrace)
		select {
		case <-c.exited:
			t.Stop()
			return
		case <-ctx.Done():
			t.Stop()
			s.killProcess(c)
			return
		case <-t.C:
			_ = c.cmd.Process.Signal(sig)
		}
	}
	<-c.exited
}

// killChild kills the live server, if any, and waits for it.
func (s *session) killChild() {
	s.mu.Lock()
	s.closing = true
	c := s.child
	s.mu.Unlock()
	if c != nil {
		s.killProcess(c)
	}
}

func (s *session) killProcess(c *child) {
	_ = c.cmd.Process.Kill()
	<-c.exited
}
