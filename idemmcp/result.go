package idemmcp

import (
	"encoding/json"
	"errors"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// answer decodes a stored outcome into a new result or error, marked as a
// replay when it is one.
func answer(stored []byte, protocolErr, replayed bool) (mcp.Result, error) {
	if protocolErr {
		var we jsonrpc.Error
		if err := json.Unmarshal(stored, &we); err != nil {
			return nil, refuse(TypeUnavailable, 0, "stored outcome does not decode: %v", err)
		}
		return nil, &we
	}
	res, err := decodeResult(stored)
	if err != nil {
		return nil, refuse(TypeUnavailable, 0, "stored outcome does not decode: %v", err)
	}
	if replayed {
		if res.Meta == nil {
			res.Meta = mcp.Meta{}
		}
		res.Meta[MetaReplayed] = true
	}
	return res, nil
}

// encodeWireError is err as JSON-RPC sends it: code, message, data.
func encodeWireError(err error) []byte {
	we := &jsonrpc.Error{Message: err.Error()}
	var inner *jsonrpc.Error
	if errors.As(err, &inner) {
		we.Code = inner.Code
		if inner == err {
			we.Data = inner.Data
		}
	}
	b, _ := json.Marshal(we) // a wire error always encodes
	return b
}

// encodeResult serializes a final result for storage, without the
// resultType the server sets for the protocol version of the caller.
func encodeResult(r *mcp.CallToolResult) ([]byte, error) {
	raw, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, err
	}
	delete(fields, "resultType")
	return json.Marshal(fields)
}

// decodeResult decodes a stored result into a new object. Structured
// content and _meta values keep their stored JSON (no float64 rounding).
func decodeResult(b []byte) (*mcp.CallToolResult, error) {
	var r mcp.CallToolResult
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, err
	}
	var aux struct {
		Structured json.RawMessage            `json:"structuredContent"`
		Meta       map[string]json.RawMessage `json:"_meta"`
	}
	if err := json.Unmarshal(b, &aux); err != nil {
		return nil, err
	}
	if aux.Structured != nil {
		r.StructuredContent = aux.Structured
	}
	if aux.Meta != nil {
		r.Meta = mcp.Meta{}
		for k, v := range aux.Meta {
			r.Meta[k] = v
		}
	}
	if r.Content == nil {
		r.Content = []mcp.Content{}
	}
	return &r, nil
}
