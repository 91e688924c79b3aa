package idemmcp

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
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

// codes maps each refusal type to its code.
var codes = map[string]int64{
	TypeKeyRequired: CodeKeyRequired,
	TypeKeyInvalid:  CodeKeyInvalid,
	TypeConflict:    CodeConflict,
	TypeInProgress:  CodeInProgress,
	TypeIncomplete:  CodeIncomplete,
	TypeUnavailable: CodeUnavailable,
}

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

// refuse builds the JSON-RPC error of a refusal.
func refuse(code int64, typ string, retryAfter time.Duration, format string, args ...any) error {
	we := RefusalError(typ, retryAfter, fmt.Sprintf(format, args...))
	we.Code = code
	return we
}
