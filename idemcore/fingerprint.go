package idemcore

import (
	"bytes"
	"encoding/json"
)

// Fingerprint turns a call's arguments into canonical bytes for Do: the JSON
// encoding of args with object keys sorted at every depth and no insignificant
// space, so the same arguments give the same bytes whatever the map order or
// struct field order of the caller. Numbers keep their JSON text (1 and 1.0
// differ). It fails only if args cannot be encoded as JSON. As with
// encoding/json, strings must be valid UTF-8: invalid bytes are replaced by
// U+FFFD, so two strings that differ only there fingerprint the same (pass
// such data as []byte, which encodes as base64). A nil and an empty
// fingerprint given to Do are the same request.
func Fingerprint(args any) ([]byte, error) {
	raw, err := json.Marshal(args)
	if err != nil {
		return nil, &OpError{Op: "fingerprint", Err: err}
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, &OpError{Op: "fingerprint", Err: err}
	}
	// encoding/json writes map keys sorted, so a round trip through
	// map[string]any is canonical.
	return json.Marshal(v)
}
