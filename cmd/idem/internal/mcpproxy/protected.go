package mcpproxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idemmcp"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Protected calls: the key, the engine's Do, the execution on the server.

// toolsCall handles a client's tools/call: relayed, refused, or run through
// the engine in a goroutine of its own.
func (s *session) toolsCall(msg []byte, h *header) {
	var params struct {
		Name      string                     `json:"name"`
		Arguments json.RawMessage            `json:"arguments"`
		Meta      map[string]json.RawMessage `json:"_meta"`
		Task      json.RawMessage            `json:"task"`
	}
	var raw mcp.CallToolParamsRaw // what idemmcp.Fingerprint reads
	if json.Unmarshal(h.Params, &params) != nil || json.Unmarshal(h.Params, &raw) != nil {
		s.relay(msg, h.ID, h.Method) // the server refuses it
		return
	}
	tool, configured := s.cfg.Tools[params.Name]
	switch {
	case !configured:
		s.mu.Lock()
		ro := s.readOnly[params.Name]
		s.mu.Unlock()
		if !ro {
			s.warnOnce("unconfigured:"+params.Name, "tool %q is not in the configuration: its calls run unprotected", params.Name)
		}
		s.relay(msg, h.ID, h.Method)
		return
	case tool.ReadOnly:
		s.relay(msg, h.ID, h.Method)
		return
	case !isNull(params.Task):
		s.warnOnce("task:"+params.Name, "task-augmented calls of %q run unprotected: the proxy records direct results only", params.Name)
		s.relay(msg, h.ID, h.Method)
		return
	}

	key, err := s.keyOf(params.Name, tool, params.Arguments, params.Meta)
	if err != nil {
		s.writeClient(refusal(h.ID, idemmcp.TypeKeyInvalid, 0, err.Error()))
		return
	}
	if key == "" {
		if s.cfg.MissingKey != MissingKeyRun {
			s.writeClient(refusal(h.ID, idemmcp.TypeKeyRequired, 0,
				fmt.Sprintf("tool %q has side effects: send an idempotency key in _meta %q", params.Name, s.cfg.KeyName())))
			return
		}
		s.warnOnce("nokey:"+params.Name, "calls of %q without an idempotency key run unprotected", params.Name)
		s.relay(msg, h.ID, h.Method)
		return
	}
	fp, err := idemmcp.Fingerprint(&raw)
	if err != nil {
		s.writeClient(errorResponse(h.ID, jsonrpc.CodeInvalidParams, "", err.Error(), nil))
		return
	}
	stored := key
	if len(raw.InputResponses) > 0 || raw.RequestState != "" {
		// A continuation is a call of its own, as in idemmcp: its round may
		// perform the effect, and it must not meet the first round's key.
		stored = idem.KeyOf("idemmcp-continuation", key, raw.RequestState)
	}
	pc := &protectedCall{}
	s.mu.Lock()
	s.protected[idKey(h.ID)] = pc
	s.mu.Unlock()
	s.calls.Add(1)
	go s.runProtected(msg, bytes.Clone(h.ID), key, stored, fp, pc)
}

// keyOf returns the call's idempotency key: natural (Tool.KeyArgs) or from
// _meta; "" if there is none (no _meta key, or a KeyArgs argument absent or
// null, as in idemmcp).
func (s *session) keyOf(name string, tool Tool, args json.RawMessage, meta map[string]json.RawMessage) (string, error) {
	if len(tool.KeyArgs) > 0 {
		var obj map[string]json.RawMessage
		if !isNull(args) {
			if err := json.Unmarshal(args, &obj); err != nil {
				return "", fmt.Errorf("arguments of %q: %w", name, err)
			}
		}
		parts := []string{name}
		for _, a := range tool.KeyArgs {
			v := obj[a]
			if isNull(v) {
				return "", nil
			}
			c, err := Canonical(v)
			if err != nil {
				return "", fmt.Errorf("argument %q of %q: %w", a, name, err)
			}
			parts = append(parts, string(c))
		}
		return idem.KeyOf(parts...), nil
	}
	keyName := s.cfg.KeyName()
	raw, ok := meta[keyName]
	if !ok || isNull(raw) {
		return "", nil
	}
	var key string
	if err := json.Unmarshal(raw, &key); err != nil {
		return "", fmt.Errorf("_meta %q must be a string", keyName)
	}
	// Checked here, not only by the engine: a continuation's stored key is
	// a hash of it, which the engine cannot check.
	if err := idem.ValidateKey(key); err != nil {
		return "", err
	}
	return key, nil
}

// runProtected runs one protected call through the engine, under the key
// stored (key, or a continuation's), and answers the client.
func (s *session) runProtected(msg, id json.RawMessage, key, stored string, fp []byte, pc *protectedCall) {
	defer s.calls.Done()
	defer func() {
		s.mu.Lock()
		delete(s.protected, idKey(id))
		s.mu.Unlock()
	}()
	maxWait := s.p.MaxWait
	if maxWait <= 0 {
		maxWait = DefaultMaxWait
	}
	var answer []byte
	for round := 1; ; round++ {
		c := s.liveChild(nil)
		if c == nil {
			return // the session failed: nobody to answer
		}
		// The deadline bounds a duplicate's wait; the first call's fn
		// outlives it (execute), so its outcome is always recorded.
		ctx, cancel := context.WithTimeout(c.ctx, maxWait)
		var ran, notRecorded []byte // the server's answer to this call's own execution
		res, err := s.p.Engine.Do(ctx, stored, fp, func(ctx context.Context) ([]byte, error) {
			resp, err := s.execute(ctx, c, msg, key)
			switch {
			case err == nil:
				ran = resp
			case errors.Is(err, idem.ErrRetryable):
				notRecorded = resp // answered, not recorded: the Result carries none
			}
			return resp, err
		})
		cancel()
		ref, refused := idemcore.RefusalOf(err)
		switch {
		case err == nil:
			answer, err = reply(res.Response, id, res.Replayed)
		case errors.Is(err, idem.ErrRetryable) && notRecorded != nil:
			answer, err = reply(notRecorded, id, false)
		case errors.Is(err, idem.ErrRetryable) && round < MaxRounds:
			// The call this one waited for was answered but not recorded:
			// the key is free, so this call runs on its own.
			continue
		case errors.Is(err, idem.ErrResponseTooLarge) && ran != nil:
			// The server answered, over the engine's limit: its caller
			// gets the answer; retries get the stored error.
			answer, err = reply(ran, id, false)
		case refused && ref.Kind != idemcore.RefusalUnavailable:
			answer, err = refusalOf(id, idemmcp.RefusalFor(ref, idem.DefaultRetryAfter, err)), nil
		case c.ctx.Err() != nil && !s.isDone() && round < MaxRounds:
			continue // the server died: run it again on the next one
		case c.ctx.Err() != nil:
			answer = errorResponse(id, CodeServerDied, TypeServerDied,
				fmt.Sprintf("the server process died during the call %d times: its outcome is unknown; a retry with the same key re-executes it", round), nil)
		case errors.Is(err, context.DeadlineExceeded):
			answer = refusal(id, idemmcp.TypeInProgress, idem.DefaultRetryAfter,
				fmt.Sprintf("the first call with this idempotency key still runs after %v", maxWait))
		default:
			// The client learns what idemmcp's middleware says; the
			// details (the key, the file) go to the operator's log.
			s.warn("the idempotency store failed: %v", err)
			if ran != nil {
				// The server ran the call, but its outcome was not
				// recorded: its caller gets the answer (the effect is
				// done); the key stays started, for the recovery policy.
				answer, err = reply(ran, id, false)
				break
			}
			answer, err = refusalOf(id, idemmcp.RefusalFor(idemcore.RefusalUnavailable.Refusal(), idem.DefaultRetryAfter, err)), nil
		}
		if err != nil && answer == nil {
			answer = refusal(id, idemmcp.TypeUnavailable, 0, "the recorded answer does not decode: "+reason(err))
		}
		break
	}
	if !pc.cancelled.Load() {
		s.writeClient(answer)
	}
}

// execute is the fn of a protected call: it sends the call to server c under
// an id of the proxy's own, with the key, the attempt and the recovered flag
// in _meta, and returns the server's answer, or a context error if c dies or
// the engine closes first.
func (s *session) execute(ctx context.Context, c *child, msg []byte, key string) ([]byte, error) {
	call, _ := idem.CallFrom(ctx)
	iid := internalPrefix + strconv.FormatInt(s.nextID.Add(1), 10)
	req, err := rewriteCall(msg, iid, key, call)
	if err != nil {
		return nil, fmt.Errorf("rewriting the call: %w", err)
	}
	ch := s.expect(iid)
	defer s.unexpect(iid)
	c.send(req)
	done := ctx.Done()
	for {
		select {
		case resp := <-ch:
			return resp, verdict(resp)
		case <-c.ctx.Done():
			// The server died: an interrupted execution. fn's context
			// descends from c.ctx, but the context package closes a
			// parent's Done before it cancels the children, so wait for
			// fn's own end: returned earlier, c.ctx's error would be
			// taken for the outcome of a call whose context is live, and
			// recorded.
			<-ctx.Done()
			return nil, ctx.Err()
		case <-done:
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				done = nil // MaxWait bounds the duplicates, not this call
				continue
			}
			return nil, ctx.Err() // the engine closes
		}
	}
}

// rewriteCall gives the client's tools/call msg the id iid and sets MetaKey,
// MetaAttempt and MetaRecovered in its params._meta.
func rewriteCall(msg []byte, iid, key string, call idem.Call) ([]byte, error) {
	o, err := parseObject(msg)
	if err != nil {
		return nil, err
	}
	params, err := parseObject(o.get("params"))
	if err != nil {
		return nil, err
	}
	attempt := max(call.Attempt, 1)
	for _, kv := range []member{
		{MetaKey, jsonString(key)},
		{MetaAttempt, json.RawMessage(strconv.Itoa(attempt))},
		{MetaRecovered, json.RawMessage(strconv.FormatBool(call.Recovered))},
	} {
		if params, err = params.setIn("_meta", kv.key, kv.raw); err != nil {
			return nil, err
		}
	}
	return o.set("id", jsonString(iid)).set("params", params.bytes()).bytes(), nil
}
