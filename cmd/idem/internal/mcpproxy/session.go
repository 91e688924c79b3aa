package mcpproxy

import (
	"fmt"
	"io"
	"sync"
	"sync/atomic"
)

// session is the state of one Serve.
type session struct {
	p      *Proxy
	cfg    *Config
	stderr io.Writer

	outMu  sync.Mutex
	out    io.Writer
	outErr error // the first failed write to out

	nextID atomic.Int64
	calls  sync.WaitGroup // the protected calls in flight

	mu          sync.Mutex
	child       *child        // the live server; nil while it restarts
	ready       chan struct{} // closed when child is set
	initReq     []byte        // the client's initialize request
	initNote    []byte        // the client's notifications/initialized
	initialized bool          // the server answered initialize or server/discover
	closing     bool          // the session ends: no restart
	pending     map[string]pending
	protected   map[string]*protectedCall
	internal    map[string]chan []byte
	readOnly    map[string]bool // tools/list's readOnlyHint, by tool
	listed      map[string]bool // every tool a tools/list page named
	warned      map[string]bool
	fatal       error
	done        chan struct{} // closed with fatal set
}

// pending is a client request relayed to server generation gen.
type pending struct {
	method string
	gen    int
}

// protectedCall is a protected tools/call in flight.
type protectedCall struct {
	cancelled atomic.Bool // the client cancelled it: no response
}

// writeClient sends one message to the client. A failed write ends the
// session.
func (s *session) writeClient(msg []byte) {
	s.outMu.Lock()
	defer s.outMu.Unlock()
	if s.outErr != nil {
		return // the client is gone
	}
	buf := make([]byte, 0, len(msg)+1)
	buf = append(append(buf, msg...), '\n')
	if _, err := s.out.Write(buf); err != nil {
		// The client is gone, but the protected calls in flight still run
		// to their end and are recorded: the session ends at EOF, as when
		// the client closes it.
		s.outErr = fmt.Errorf("mcp-proxy: writing to the client: %w", err)
		s.warn("writing to the client failed (%v): answers are dropped until the session ends", err)
	}
}

// warnOnce prints a warning the first time its topic comes up.
func (s *session) warnOnce(topic, format string, args ...any) {
	s.mu.Lock()
	seen := s.warned[topic]
	s.warned[topic] = true
	s.mu.Unlock()
	if !seen {
		s.warn(format, args...)
	}
}

func (s *session) warn(format string, args ...any) {
	fmt.Fprintf(s.stderr, "idem mcp-proxy: "+format+"\n", args...)
}

// fail ends the session with err (the first one wins).
func (s *session) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fatal == nil {
		s.fatal = err
		s.closing = true
		close(s.done)
	}
}

func (s *session) isDone() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// err is the session's fatal error, or nil.
func (s *session) err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fatal
}
