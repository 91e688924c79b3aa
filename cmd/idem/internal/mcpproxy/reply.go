package mcpproxy

import (
	"encoding/json"
	"errors"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemmcp"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// The answers to the client: replies from the record, refusals.

// reply is the stored server answer resp under the client's id; a replayed
// result gets MetaReplayed in its _meta.
func reply(resp, id json.RawMessage, replayed bool) ([]byte, error) {
	o, err := parseObject(resp)
	if err != nil {
		return nil, err
	}
	o = o.set("id", id)
	if r := o.get("result"); replayed && r != nil {
		result, err := parseObject(r)
		if err != nil {
			return nil, err
		}
		if result, err = result.setIn("_meta", MetaReplayed, json.RawMessage("true")); err != nil {
			return nil, err
		}
		o = o.set("result", result.bytes())
	}
	return o.bytes(), nil
}

// reason is err's text without the engine's "idem: op "key": " prefix of an
// *idem.OpError: a refusal's message already names what refused it
// ("idempotency: ").
func reason(err error) string {
	if oe, ok := errors.AsType[*idem.OpError](err); ok && oe.Err != nil {
		return oe.Err.Error()
	}
	return err.Error()
}

// refusal is idemmcp's refusal of type typ as the answer to id.
func refusal(id json.RawMessage, typ string, retryAfter time.Duration, message string) []byte {
	return refusalOf(id, idemmcp.RefusalError(typ, retryAfter, message))
}

// refusalOf is the JSON-RPC error we as the answer to id.
func refusalOf(id json.RawMessage, we *jsonrpc.Error) []byte {
	e := map[string]any{"code": we.Code, "message": we.Message}
	if len(we.Data) > 0 {
		e["data"] = we.Data
	}
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "error": e})
	return b
}
