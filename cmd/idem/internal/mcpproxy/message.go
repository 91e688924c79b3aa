package mcpproxy

import (
	"bytes"
	"encoding/json"
)

// JSON-RPC messages as the proxy reads and writes them: ids, headers, answers.

// idKey is the map key of a JSON-RPC id: a string id re-encoded (so that
// "a\/b" and "a/b" are one id), a number's JSON text.
func idKey(id json.RawMessage) string {
	id = bytes.TrimSpace(id)
	var str string
	if len(id) > 0 && id[0] == '"' && json.Unmarshal(id, &str) == nil {
		return string(jsonString(str))
	}
	return string(id)
}

// header is what the proxy reads of every message.
type header struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
}

func (h *header) hasID() bool { return !isNull(h.ID) }

// errorResponse is a JSON-RPC error answer to id; typ, if not empty, and the
// fields of extra go into its data.
func errorResponse(id json.RawMessage, code int64, typ, message string, extra map[string]any) []byte {
	e := map[string]any{"code": code, "message": "idem mcp-proxy: " + message}
	if typ != "" {
		data := map[string]any{"type": typ}
		for k, v := range extra {
			data[k] = v
		}
		e["data"] = data
	}
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "error": e})
	return b
}
