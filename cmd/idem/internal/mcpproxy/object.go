package mcpproxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// object is a JSON object read member by member: its members keep their order
// and their values keep their bytes, so a message the proxy edits (a new id,
// a _meta entry) changes only what it edits.
type object []member

type member struct {
	key string
	raw json.RawMessage
}

// parseObject reads the JSON object b. It fails if b is not one object.
func parseObject(b []byte) (object, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	t, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if t != json.Delim('{') {
		return nil, errors.New("not a JSON object")
	}
	var o object
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, err
		}
		k, _ := t.(string) // a key is always a string
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, err
		}
		o = append(o, member{key: k, raw: raw})
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("text after the JSON object")
	}
	return o, nil
}

// get returns the value of key, or nil.
func (o object) get(key string) json.RawMessage {
	for i := len(o) - 1; i >= 0; i-- { // the last duplicate wins, as in encoding/json
		if o[i].key == key {
			return o[i].raw
		}
	}
	return nil
}

// set replaces the value of key in place, or appends it.
func (o object) set(key string, raw json.RawMessage) object {
	for i := len(o) - 1; i >= 0; i-- {
		if o[i].key == key {
			o[i].raw = raw
			return o
		}
	}
	return append(o, member{key: key, raw: raw})
}

// bytes encodes the object: each key re-encoded, each value as read.
func (o object) bytes() []byte {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, m := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(jsonString(m.key))
		b.WriteByte(':')
		b.Write(m.raw)
	}
	b.WriteByte('}')
	return b.Bytes()
}

// setIn sets key inside the object found at o's member at, creating it (and
// o's member) if absent: setIn(params, "_meta", k, v).
func (o object) setIn(at, key string, raw json.RawMessage) (object, error) {
	inner := object{}
	if cur := o.get(at); cur != nil && !isNull(cur) {
		var err error
		if inner, err = parseObject(cur); err != nil {
			return nil, fmt.Errorf("%s: %w", at, err)
		}
	}
	return o.set(at, inner.set(key, raw).bytes()), nil
}

// jsonString encodes s as a JSON string, without the HTML escapes of
// json.Marshal.
func jsonString(s string) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// isNull reports whether raw is JSON null (or empty, an absent member).
func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}
