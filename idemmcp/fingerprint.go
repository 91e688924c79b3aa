package idemmcp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"sort"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Fingerprint returns the canonical bytes that define "the same tools/call"
// for the engine: the tool's name, its arguments as parsed JSON and, for a
// continuation of a multi-round-trip call, the RequestState and the
// InputResponses. Never _meta: clients add their own entries to it on every
// request (go-sdk v1.8.0 adds io.modelcontextprotocol/… entries), and the
// idempotency key itself travels there.
//
// The canonical form is JSON: object keys sorted (by their UTF-8 bytes) at
// every depth, no insignificant space, strings re-encoded, and every number
// written as a normalised decimal: the digits of its exact value without
// leading or trailing zeros and a decimal exponent, so 1, 1.0, 1e0 and 10e-1
// are one number and 9007199254740993 stays distinct from 9007199254740992
// (no float64 rounding). Missing or null arguments are the empty object.
//
// How this differs from idem.Fingerprint: idem.Fingerprint encodes a Go value
// and keeps each number's JSON text, so there 1 and 1.0 differ; here the
// input is the JSON a client sent, parsed, and numbers compare by value. As
// there, an object with a repeated key keeps its last value, and invalid
// UTF-8 in a string is replaced by U+FFFD before comparison.
//
// It fails, wrapping ErrInvalidArguments, if the arguments are not a JSON
// object (or null), or if InputResponses cannot be encoded.
func Fingerprint(p *mcp.CallToolParamsRaw) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(`{"arguments":`)
	args := bytes.TrimSpace(p.Arguments)
	if len(args) == 0 || string(args) == "null" {
		args = []byte("{}")
	}
	if args[0] != '{' {
		return nil, fmt.Errorf("%w: arguments must be a JSON object", ErrInvalidArguments)
	}
	if err := canonical(&b, args); err != nil {
		return nil, fmt.Errorf("%w: arguments: %v", ErrInvalidArguments, err)
	}
	if len(p.InputResponses) > 0 {
		raw, err := json.Marshal(p.InputResponses)
		if err != nil {
			return nil, fmt.Errorf("%w: inputResponses: %v", ErrInvalidArguments, err)
		}
		b.WriteString(`,"inputResponses":`)
		if err := canonical(&b, raw); err != nil {
			return nil, fmt.Errorf("%w: inputResponses: %v", ErrInvalidArguments, err)
		}
	}
	if p.RequestState != "" {
		b.WriteString(`,"requestState":`)
		writeString(&b, p.RequestState)
	}
	b.WriteString(`,"tool":`)
	writeString(&b, p.Name)
	b.WriteByte('}')
	return b.Bytes(), nil
}

// ErrInvalidArguments is returned by Fingerprint for arguments that are not
// a JSON object.
var ErrInvalidArguments = errors.New("idemmcp: invalid arguments")

// canonical writes the canonical form of the single JSON value in raw.
func canonical(b *bytes.Buffer, raw []byte) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("trailing data after the JSON value")
	}
	return writeValue(b, v)
}

func writeValue(b *bytes.Buffer, v any) error {
	switch v := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		if v {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case string:
		writeString(b, v)
	case json.Number:
		n, err := normalNumber(string(v))
		if err != nil {
			return err
		}
		b.WriteString(n)
	case []any:
		b.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := writeValue(b, e); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			writeString(b, k)
			b.WriteByte(':')
			if err := writeValue(b, v[k]); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	default:
		return fmt.Errorf("unexpected JSON value %T", v)
	}
	return nil
}

func writeString(b *bytes.Buffer, s string) {
	enc, _ := json.Marshal(s) // a string always encodes
	b.Write(enc)
}

// normalNumber writes a JSON number as its exact value in normal form:
// "0", or an optional "-", the significant digits (no leading or trailing
// zeros) and "e" with the decimal exponent, as in "15e-1" for 1.5 and "1e2"
// for 100. The exponent is computed exactly, however large.
func normalNumber(s string) (string, error) {
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	mant, exp, _ := strings.Cut(strings.ToLower(s), "e")
	intPart, frac, _ := strings.Cut(mant, ".")
	digits := intPart + frac
	e := new(big.Int)
	if exp != "" {
		if _, ok := e.SetString(strings.TrimPrefix(exp, "+"), 10); !ok {
			return "", fmt.Errorf("bad number %q", s)
		}
	}
	e.Sub(e, big.NewInt(int64(len(frac))))
	digits = strings.TrimLeft(digits, "0")
	if digits == "" {
		return "0", nil // -0 and 0.000 are 0
	}
	trimmed := strings.TrimRight(digits, "0")
	e.Add(e, big.NewInt(int64(len(digits)-len(trimmed))))
	out := trimmed + "e" + e.String()
	if neg {
		out = "-" + out
	}
	return out, nil
}
