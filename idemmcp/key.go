package idemmcp

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/idemkit/idem/idemcore"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The idempotency key of a call, by its tool's policy.

// key returns the call's idempotency key by the tool's policy: "" when it
// has none.
func (m *Middleware) key(t *toolEntry, r *mcp.CallToolRequest) (string, error) {
	switch t.policy.Key.kind {
	case keyNone:
		return "", nil
	case keyArgs:
		var args map[string]json.RawMessage
		if len(r.Params.Arguments) > 0 {
			if err := json.Unmarshal(r.Params.Arguments, &args); err != nil {
				return "", &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("%v: %v", ErrInvalidArguments, err)}
			}
		}
		parts := []string{r.Params.Name}
		for _, name := range t.policy.Key.args {
			v, ok := args[name]
			if !ok || string(v) == "null" {
				return "", nil
			}
			var b bytes.Buffer
			if err := canonical(&b, v); err != nil {
				return "", &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("%v: %v", ErrInvalidArguments, err)}
			}
			parts = append(parts, b.String())
		}
		return idemcore.KeyOf(parts...), nil
	}
	v, ok := r.Params.Meta[MetaKey]
	if !ok || v == nil {
		return "", nil
	}
	key, ok := v.(string)
	if !ok {
		return "", refuse(TypeKeyInvalid, 0, "_meta %q must be a string", MetaKey)
	}
	if why := badKey(key); why != "" {
		return "", refuse(TypeKeyInvalid, 0, "invalid key: %s", why)
	}
	return key, nil
}

// badKey says what is wrong with a key, by DESIGN.md's rule 1 (Stripe's
// 255-byte limit): "" if nothing.
func badKey(key string) string {
	switch {
	case strings.TrimSpace(key) == "":
		return "empty or blank"
	case len(key) > idemcore.MaxKeyLen:
		return fmt.Sprintf("%d bytes, the limit is %d", len(key), idemcore.MaxKeyLen)
	case !utf8.ValidString(key):
		return "not valid UTF-8"
	case strings.ContainsFunc(key, unicode.IsControl):
		return "holds control characters"
	}
	// The engine's rules (white space at an end, format characters), also
	// when the stored key is a hash (Scope, a continuation), which the
	// engine cannot check.
	if err := idemcore.ValidateKey(key); err != nil {
		return strings.TrimPrefix(err.Error(), idemcore.ErrInvalidKey.Error()+": ")
	}
	return ""
}
