package mcpproxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"sort"
	"strings"
)

// Canonical returns the canonical JSON text of the JSON value data, the form
// of each argument in a natural key (Tool.KeyArgs), byte for byte the form
// idemmcp.Fingerprint and idemmcp.KeyFromArgs write (a test pins them), so
// the proxy and the middleware make one key of one call: objects with their keys sorted (by bytes of
// UTF-8) at every depth, no insignificant space, strings re-encoded by
// encoding/json (json.Marshal), and numbers as normalised decimals, so that 1, 1.0, 10e-1 and
// 0.1e1 give the same text while 9007199254740993 and 9007199254740992 stay
// distinct (no float64 rounding). A number is written as its significant
// digits and a base-10 exponent: "1e0", "-15e-1", "0".
//
// It differs from idem.Fingerprint, which encodes Go values and keeps each
// number's JSON text (1 and 1.0 differ there): here the input is the JSON a
// client sent, and two clients (or one client's two SDKs) may write one number
// two ways. As with encoding/json, invalid UTF-8 in a string is replaced by
// U+FFFD, so two strings that differ only there give the same text. A
// duplicate object key keeps its last value, as encoding/json does.
//
// It fails on input that is not one JSON value.
func Canonical(data []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("canonical JSON: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("canonical JSON: text after the value")
	}
	var b bytes.Buffer
	if err := writeCanonical(&b, v); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

func writeCanonical(b *bytes.Buffer, v any) error {
	switch v := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		if v {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case json.Number:
		n, err := normalNumber(string(v))
		if err != nil {
			return err
		}
		b.WriteString(n)
	case string:
		writeString(b, v)
	case []any:
		b.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := writeCanonical(b, e); err != nil {
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
			if err := writeCanonical(b, v[k]); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	default:
		return fmt.Errorf("canonical JSON: unexpected %T", v)
	}
	return nil
}

func writeString(b *bytes.Buffer, s string) {
	enc, _ := json.Marshal(s) // a string always encodes
	b.Write(enc)
}

// normalNumber writes the JSON number text s as its significant digits
// (no leading or trailing zeros) and a decimal exponent: "-15e-1" for -1.50.
// Zero, of any sign or form, is "0".
func normalNumber(s string) (string, error) {
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	mant, exp := s, "0"
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		mant, exp = s[:i], s[i+1:]
	}
	e, ok := new(big.Int).SetString(strings.TrimPrefix(exp, "+"), 10)
	if !ok {
		return "", fmt.Errorf("canonical JSON: bad number %q", s)
	}
	intPart, frac := mant, ""
	if i := strings.IndexByte(mant, '.'); i >= 0 {
		intPart, frac = mant[:i], mant[i+1:]
	}
	digits := intPart + frac
	e.Sub(e, big.NewInt(int64(len(frac))))
	digits = strings.TrimLeft(digits, "0")
	if digits == "" {
		return "0", nil
	}
	trimmed := strings.TrimRight(digits, "0")
	e.Add(e, big.NewInt(int64(len(digits)-len(trimmed))))
	out := trimmed + "e" + e.String()
	if neg {
		out = "-" + out
	}
	return out, nil
}
