package mcpproxy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// The client's side of the session: its messages, relayed or handled.

// readClient relays the client's messages until in ends; it returns nil at
// EOF.
func (s *session) readClient(in io.Reader) error {
	r := bufio.NewReader(in)
	for {
		line, err := r.ReadBytes('\n')
		if msg := bytes.TrimSpace(line); len(msg) > 0 {
			s.fromClient(msg)
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if s.isDone() {
			return nil
		}
	}
}

func (s *session) fromClient(msg []byte) {
	if msg[0] == '[' && s.refuseBatch(msg) {
		return
	}
	var h header
	if json.Unmarshal(msg, &h) != nil {
		s.relay(msg, nil, "") // not ours to judge: the server answers it
		return
	}
	switch {
	case h.Method == "" && h.hasID():
		// The client's answer to a server's request (sampling, elicitation,
		// roots): for the live server only.
		s.mu.Lock()
		c := s.child
		ok := c != nil && c.requests[idKey(h.ID)]
		if ok {
			delete(c.requests, idKey(h.ID))
		}
		s.mu.Unlock()
		if ok {
			c.send(msg)
		}
	case h.Method == "tools/call" && h.hasID():
		s.toolsCall(msg, &h)
	case h.Method == "tools/call" && s.protects(h.Params):
		// No id (a notification) or a null one: it cannot be recorded as
		// a call nor answered under its own id, and relayed it would run
		// unprotected.
		s.warn("a tools/call of a protected tool without an id was not relayed")
		if h.ID != nil {
			s.writeClient(errorResponse(h.ID, jsonrpc.CodeInvalidRequest, "",
				"a tools/call of a protected tool needs an id (not null)", nil))
		}
	case h.Method == "notifications/cancelled":
		var p struct {
			RequestID json.RawMessage `json:"requestId"`
		}
		_ = json.Unmarshal(h.Params, &p)
		s.mu.Lock()
		pc := s.protected[idKey(p.RequestID)]
		s.mu.Unlock()
		if pc != nil {
			pc.cancelled.Store(true)
			return
		}
		s.relay(msg, nil, "")
	case h.hasID():
		if h.Method == "initialize" {
			s.mu.Lock()
			s.initReq = bytes.Clone(msg)
			s.mu.Unlock()
		}
		s.relay(msg, h.ID, h.Method)
	default:
		if h.Method == "notifications/initialized" {
			s.mu.Lock()
			s.initNote = bytes.Clone(msg)
			s.mu.Unlock()
		}
		s.relay(msg, nil, "")
	}
}

// refuseBatch answers a JSON-RPC batch (an array of messages, which the
// 2025-03-26 protocol allows) that holds a tools/call of a protected tool:
// each request in it gets an invalid-request error and nothing reaches the
// server, which would otherwise run its calls unprotected. It reports false,
// and does nothing, for any other batch, which is relayed as it is.
func (s *session) refuseBatch(msg []byte) bool {
	var batch []json.RawMessage
	if json.Unmarshal(msg, &batch) != nil {
		return false
	}
	protected := false
	for _, m := range batch {
		var h header
		if json.Unmarshal(m, &h) == nil && h.Method == "tools/call" && s.protects(h.Params) {
			protected = true
		}
	}
	if !protected {
		return false
	}
	var answers [][]byte
	for _, m := range batch {
		var h header
		if json.Unmarshal(m, &h) != nil || !h.hasID() || h.Method == "" {
			continue // a notification, or an answer, gets no answer
		}
		answers = append(answers, errorResponse(h.ID, jsonrpc.CodeInvalidRequest, "",
			"a batch that holds a tools/call of a protected tool is refused: send each request on its own", nil))
	}
	if len(answers) > 0 {
		s.writeClient(append(append([]byte{'['}, bytes.Join(answers, []byte{','})...), ']'))
	}
	return true
}

// protects reports whether params (of a tools/call) name a tool the
// configuration protects.
func (s *session) protects(params json.RawMessage) bool {
	var p struct {
		Name string `json:"name"`
	}
	if json.Unmarshal(params, &p) != nil {
		return false
	}
	tool, ok := s.cfg.Tools[p.Name]
	return ok && !tool.ReadOnly
}

// relay sends msg to the live server as it is, waiting for a restart if
// need be; a request (id not nil) is remembered until its answer, so that
// the client gets CodeServerDied if the server dies first.
func (s *session) relay(msg []byte, id json.RawMessage, method string) {
	c := s.liveChild(func(c *child) {
		if id != nil {
			s.pending[idKey(id)] = pending{method: method, gen: c.gen}
		}
	})
	if c != nil {
		c.send(msg)
	}
}

// liveChild waits for a live server and returns it, after running register
// (if not nil) under the session's lock with it; nil if the session failed.
func (s *session) liveChild(register func(*child)) *child {
	for {
		s.mu.Lock()
		if c := s.child; c != nil {
			if register != nil {
				register(c)
			}
			s.mu.Unlock()
			return c
		}
		ready := s.ready
		s.mu.Unlock()
		select {
		case <-ready:
		case <-s.done:
			return nil
		}
	}
}
