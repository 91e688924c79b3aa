package mcpproxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"

	"github.com/idemkit/idem"
)

// Which of the server's answers are recorded.

// Errors marking an answer the proxy does not record.
var (
	errRefused  = errors.New("the server refused the request before running it")
	errNotFinal = errors.New("the result is not final")
	errServer   = errors.New("the server marked the failure retryable")
)

// refusedCodes are the JSON-RPC errors of a request the server did not run.
var refusedCodes = map[int]bool{-32700: true, -32600: true, -32601: true, -32602: true}

// verdict says whether the server's answer resp is recorded (nil) or not (an
// error wrapped by idem.Retryable).
func verdict(resp []byte) error {
	var m struct {
		Result json.RawMessage `json:"result"`
		Error  *struct {
			Code int `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(resp, &m); err != nil {
		return nil // relayed as it came; recorded as it came
	}
	if m.Error != nil {
		if refusedCodes[m.Error.Code] {
			return idem.Retryable(errRefused)
		}
		return nil
	}
	var r struct {
		IsError bool `json:"isError"`
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
		ResultType    string                     `json:"resultType"`
		InputRequests json.RawMessage            `json:"inputRequests"`
		Task          json.RawMessage            `json:"task"`
		Meta          map[string]json.RawMessage `json:"_meta"`
	}
	_ = json.Unmarshal(m.Result, &r)
	if ir := bytes.TrimSpace(r.InputRequests); !isNull(ir) && string(ir) != "[]" && string(ir) != "{}" {
		return idem.Retryable(errNotFinal)
	}
	if r.ResultType == "input_required" || !isNull(r.Task) {
		return idem.Retryable(errNotFinal)
	}
	if string(bytes.TrimSpace(r.Meta[MetaRetryable])) == "true" {
		return idem.Retryable(errServer)
	}
	if r.IsError && len(r.Content) > 0 && r.Content[0].Type == "text" {
		for _, prefix := range sdkRefusals {
			if strings.HasPrefix(r.Content[0].Text, prefix) {
				return idem.Retryable(errRefused)
			}
		}
	}
	return nil
}

// sdkRefusals start the text of the isError results by which the MCP SDKs
// refuse a call before its handler runs: go-sdk v1.8.0's schema validation
// (as idemmcp recognises it), and the TypeScript SDK's (1.32) invalid params
// and unknown tool, which it answers as isError results of its JSON-RPC error.
var sdkRefusals = []string{`validating "arguments": `, "MCP error -32602: "}
