package idemmcp

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/idemkit/idem/idemcore"
)

// The JSON-RPC error codes of the middleware's refusals. They sit in the
// range JSON-RPC 2.0 leaves to implementations (-32000 to -32099), apart from
// the codes go-sdk v1.8.0 and the MCP specification use (-32002, -32020 to
// -32022, -32042). Each refusal also carries data {"type": …} naming it; the
// types idempotency_key_in_progress and idempotency_key_conflict are those of
// the closed proposal SEP-3182 ("Request Idempotency"). An agent framework
// owns the key and acts on them: wait retryAfter seconds and send the same
// call again (in progress), or mint a new key for what is a new intent
// (conflict). Nothing is stored for a refusal.
const (
	// CodeKeyRequired: a side-effecting tool was called without a key.
	// data.type is TypeKeyRequired.
	CodeKeyRequired = -32060
	// CodeKeyInvalid: the key is empty, blank, longer than 255 bytes, not
	// UTF-8, has white space at either end, holds control or format
	// characters (idem.ValidateKey), or is not a JSON string; with
	// Options.Scope too.
	CodeKeyInvalid = -32061
	// CodeConflict: the key was used before with another tool or other
	// arguments (the IETF Idempotency-Key draft's HTTP 422). The stored
	// outcome is untouched.
	CodeConflict = -32062
	// CodeInProgress: the first call with the key is still running; data
	// carries retryAfter in seconds (the IETF draft's HTTP 409 and
	// Retry-After).
	CodeInProgress = -32063
	// CodeIncomplete: an earlier execution with the key was interrupted (a
	// crash) and the engine refuses to re-execute it (idem.RecoverRefuse)
	// until an operator resolves the key.
	CodeIncomplete = -32064
	// CodeUnavailable: the idempotency store failed (or is closed); the tool
	// did not run. data carries retryAfter.
	CodeUnavailable = -32065
)

// The data.type of each refusal, sent with the code of the same name.
const (
	// TypeKeyRequired is sent with CodeKeyRequired.
	TypeKeyRequired = "idempotency_key_required"
	// TypeKeyInvalid is sent with CodeKeyInvalid.
	TypeKeyInvalid = "idempotency_key_invalid"
	// TypeConflict is sent with CodeConflict (SEP-3182's name).
	TypeConflict = "idempotency_key_conflict"
	// TypeInProgress is sent with CodeInProgress (SEP-3182's name).
	TypeInProgress = "idempotency_key_in_progress"
	// TypeIncomplete is sent with CodeIncomplete.
	TypeIncomplete = "idempotency_key_incomplete"
	// TypeUnavailable is sent with CodeUnavailable.
	TypeUnavailable = "idempotency_store_unavailable"
)

// Refusal is the data of a refusal's JSON-RPC error, as sent on the wire:
// {"type": "idempotency_key_in_progress", "retryAfter": 1}.
type Refusal struct {
	// Type names the refusal: one of the Type* constants.
	Type string `json:"type"`
	// RetryAfter is how long to wait before sending the same call again, in
	// whole seconds (rounded up, at least 1); 0 (absent) when waiting does
	// not help.
	RetryAfter int `json:"retryAfter,omitempty"`
	// Code is the JSON-RPC error code, not part of data.
	Code int64 `json:"-"`
}

// RefusalOf reports whether err, as returned by a go-sdk client's CallTool
// (or by the middleware), is one of the middleware's refusals, and returns
// it. Other errors, tool errors included, give false.
func RefusalOf(err error) (*Refusal, bool) {
	var we *jsonrpc.Error
	if !errors.As(err, &we) || len(we.Data) == 0 {
		return nil, false
	}
	var r Refusal
	if json.Unmarshal(we.Data, &r) != nil {
		return nil, false
	}
	if _, ok := codes[r.Type]; !ok {
		return nil, false
	}
	r.Code = we.Code
	return &r, true
}

// types names the data.type of each kind of refusal (idemcore.RefusalKind):
// a kind's code is idemcore's (the Code* constants), a type's code that of
// its kind. RefusalNotStored has no type: it is an internal error.
var types = map[idemcore.RefusalKind]string{
	idemcore.RefusalKeyMissing:  TypeKeyRequired,
	idemcore.RefusalKeyInvalid:  TypeKeyInvalid,
	idemcore.RefusalConflict:    TypeConflict,
	idemcore.RefusalInProgress:  TypeInProgress,
	idemcore.RefusalIncomplete:  TypeIncomplete,
	idemcore.RefusalUnavailable: TypeUnavailable,
}

// codes maps each refusal type to its code.
var codes = func() map[string]int64 {
	m := map[string]int64{}
	for k, typ := range types {
		m[typ] = k.Refusal().Code
	}
	return m
}()

// RefusalError returns the JSON-RPC error of a refusal of type typ (a Type*
// constant, sent with its Code*; an unknown type gets CodeUnavailable), with
// retryAfter in data rounded up to whole seconds (0: none) and "idempotency: "
// and message as its message. It is what the middleware sends, for adapters
// that speak JSON-RPC themselves (idem mcp-proxy).
func RefusalError(typ string, retryAfter time.Duration, message string) *jsonrpc.Error {
	code, ok := codes[typ]
	if !ok {
		code = CodeUnavailable
	}
	r := Refusal{Type: typ}
	if retryAfter > 0 {
		r.RetryAfter = max(1, int(math.Ceil(retryAfter.Seconds())))
	}
	data, _ := json.Marshal(r) // a Refusal always encodes
	return &jsonrpc.Error{Code: code, Message: "idempotency: " + message, Data: data}
}

// RefusalFor returns the JSON-RPC error by which the middleware (and idem
// mcp-proxy) refuses a call the engine answered with err, whose refusal is
// ref (idemcore.RefusalOf(err)): ref's Code, data {"type", "retryAfter"} as
// RefusalError sends it, and a message saying why, the same for every
// adapter. retryAfter is the wait suggested, for in progress and a store
// unavailable, when ref carries none. A RefusalNotStored is an internal
// error (jsonrpc.CodeInternalError) without data.
func RefusalFor(ref idemcore.Refusal, retryAfter time.Duration, err error) *jsonrpc.Error {
	if ref.RetryAfter > 0 {
		retryAfter = ref.RetryAfter
	}
	var msg string
	switch ref.Kind {
	case idemcore.RefusalNotStored:
		return &jsonrpc.Error{Code: ref.Code, Message: "idempotency: the answer to the first call with this key " +
			"was too large to record, so it cannot be replayed"}
	case idemcore.RefusalKeyInvalid:
		msg = "invalid key: " + reason(err)
		retryAfter = 0
	case idemcore.RefusalConflict:
		msg, retryAfter = "the key was used with another tool or other arguments", 0
	case idemcore.RefusalInProgress:
		msg = "the first call with this key is still running"
		if errors.Is(err, idemcore.ErrRetryable) {
			msg = "the call with this key ended without a recorded answer; retry"
		}
	case idemcore.RefusalIncomplete:
		msg, retryAfter = "an earlier execution with this key was interrupted and its outcome is unknown: "+
			"an operator must resolve the key", 0
	default:
		msg = "the idempotency store failed; the tool did not run"
	}
	return RefusalError(types[ref.Kind], retryAfter, msg)
}

// reason is err's text without the engine's "idem: op "key": " prefix of an
// *idemcore.OpError: a refusal's message already names what refused it.
func reason(err error) string {
	if oe, ok := errors.AsType[*idemcore.OpError](err); ok && oe.Err != nil {
		return oe.Err.Error()
	}
	return err.Error()
}

// refuse builds the JSON-RPC error of a refusal.
func refuse(typ string, retryAfter time.Duration, format string, args ...any) error {
	return RefusalError(typ, retryAfter, fmt.Sprintf(format, args...))
}
