package idemmcp

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/idemkit/idem/idemcore"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Running a call through the engine, and its answer.

// Outcomes that are stored as errors, so that a DoTx tool's writes roll
// back; their Message is the serialized outcome.
const (
	codeToolError     = "mcp_tool_error"
	codeProtocolError = "mcp_protocol_error"
)

var (
	errNotRun   = errors.New("idemmcp: the tool's handler did not run (its input was refused)")
	errNotFinal = errors.New("idemmcp: the result asks for input: not final")
)

// run runs the handling through the engine and turns the outcome into the
// answer.
func (m *Middleware) run(ctx context.Context, method string, r *mcp.CallToolRequest, next mcp.MethodHandler,
	t *toolEntry, key string, fp []byte) (mcp.Result, error) {
	// The answer of a handling whose outcome is not stored, from this
	// call's own execution.
	var (
		own    bool
		ownRes mcp.Result
		ownErr error
		// ran, ranRes, ranErr: the answer of this call's own handling, for
		// an outcome too large to record (the engine's MaxResponseSize) or
		// one the store failed to record after a Do tool ran.
		ran    bool
		ranRes mcp.Result
		ranErr error
	)
	body := func(ctx context.Context) ([]byte, error) {
		own, ownRes, ownErr = false, nil, nil // fn of DoTx may run again
		st := &callState{m: m, tx: ctx.Value(txKey{})}
		res, err := next(context.WithValue(ctx, stateKey{}, st), method, r)
		ran, ranRes, ranErr = true, res, err
		keep := func(why error) ([]byte, error) {
			own, ownRes, ownErr = true, res, err
			return nil, idemcore.Retryable(why)
		}
		if t.tracked && !st.ran {
			return keep(errNotRun)
		}
		if err != nil {
			if errors.Is(err, idemcore.ErrRetryable) {
				return keep(err)
			}
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				own, ownRes, ownErr = true, nil, err
				return nil, err
			}
			return nil, idemcore.WithCode(errors.New(string(encodeWireError(err))), codeProtocolError)
		}
		ctr, ok := res.(*mcp.CallToolResult)
		if !ok || ctr == nil {
			return keep(fmt.Errorf("idemmcp: unexpected result %T", res))
		}
		switch {
		case ctr.InputRequests != nil:
			return keep(errNotFinal)
		case errors.Is(ctr.GetError(), idemcore.ErrRetryable):
			return keep(ctr.GetError())
		case !t.tracked && ctr.IsError && ctr.GetError() != nil &&
			strings.HasPrefix(ctr.GetError().Error(), `validating "arguments": `):
			return keep(errNotRun) // the SDK's schema check, before the handler
		}
		b, err := encodeResult(ctr)
		if err != nil {
			return keep(err)
		}
		if ctr.IsError {
			return nil, idemcore.WithCode(errors.New(string(b)), codeToolError)
		}
		return b, nil
	}
	res, err := t.do(ctx, key, fp, body)
	if own {
		return ownRes, ownErr // not stored: this execution's own answer
	}
	if ran && errors.Is(err, idemcore.ErrResponseTooLarge) {
		// The tool ran and answered, but the answer is over the engine's
		// limit: its caller gets it; retries get the stored error.
		return ranRes, ranErr
	}
	var ie *idemcore.Error
	switch {
	case err == nil:
		return answer(res.Response, false, res.Replayed)
	case errors.As(err, &ie) && (ie.Code == codeToolError || ie.Code == codeProtocolError):
		return answer([]byte(ie.Message), ie.Code == codeProtocolError, res.Replayed || ie.Replayed)
	}
	ref, refused := idemcore.RefusalOf(err)
	switch {
	case refused && ref.Kind != idemcore.RefusalUnavailable:
		return nil, RefusalFor(ref, m.opts.RetryAfter, err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return nil, err
	case errors.As(err, &ie):
		// A stored error of another writer's (an operator's resolution).
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: ie.Error()}
	}
	if ran && !t.tx {
		// A Do tool ran and did its effect, but the store failed to record
		// its outcome: its caller gets its answer (as idemhttp answers with
		// the handler's response); the key stays started, for the recovery
		// policy. A DoTx tool's writes rolled back with the failed commit.
		cause := err
		if oe, ok := errors.AsType[*idemcore.OpError](err); ok && oe.Err != nil {
			cause = oe.Err // no key in logs
		}
		m.opts.Logger.Warn("idemmcp: the tool ran but its outcome was not recorded", "tool", r.Params.Name, "err", cause)
		return ranRes, ranErr
	}
	return nil, RefusalFor(idemcore.RefusalUnavailable.Refusal(), m.opts.RetryAfter, err)
}
