package taubench

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"strconv"
	"strings"
)

// This file holds the JSON model the tools work on. The reference keeps the
// database as Python dicts and answers with json.dumps, so records are decoded
// into a tree that keeps object keys in document order (as a dict does) and
// encoded back the way json.dumps writes them: ", " and ": " separators,
// non-ASCII escaped, floats in Python's repr. Tree values are *object, []any,
// string, json.Number (a number as written, int or float), float64 (a number
// the tools computed), bool and nil.

// object is a JSON object that keeps its keys in insertion order, like a
// Python dict. Objects are small (a dozen keys at most in the τ-bench data),
// so lookups scan. The accessors are nil-safe and return zero values for
// missing keys or values of another type.
type object struct {
	keys []string
	vals []any
}

// newObject builds an object from alternating keys and values.
func newObject(kv ...any) *object {
	o := &object{}
	for i := 0; i+1 < len(kv); i += 2 {
		o.set(kv[i].(string), kv[i+1])
	}
	return o
}

func (o *object) index(key string) int {
	if o == nil {
		return -1
	}
	for i, k := range o.keys {
		if k == key {
			return i
		}
	}
	return -1
}

// get returns the value under key, or nil.
func (o *object) get(key string) any {
	if i := o.index(key); i >= 0 {
		return o.vals[i]
	}
	return nil
}

// set replaces the value under key in place, or appends key, as assigning
// to a Python dict does.
func (o *object) set(key string, v any) {
	if i := o.index(key); i >= 0 {
		o.vals[i] = v
		return
	}
	o.keys = append(o.keys, key)
	o.vals = append(o.vals, v)
}

// str returns the string under key, or "".
func (o *object) str(key string) string {
	s, _ := o.get(key).(string)
	return s
}

// obj returns the object under key, or nil.
func (o *object) obj(key string) *object {
	v, _ := o.get(key).(*object)
	return v
}

// list returns the array under key, or nil.
func (o *object) list(key string) []any {
	v, _ := o.get(key).([]any)
	return v
}

// parseJSON decodes one JSON value into the ordered tree.
func parseJSON(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := decodeValue(dec)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("unexpected data after the JSON value")
	}
	return v, nil
}

// parseObject decodes a JSON object into the ordered tree.
func parseObject(data []byte) (*object, error) {
	v, err := parseJSON(data)
	if err != nil {
		return nil, err
	}
	o, ok := v.(*object)
	if !ok {
		return nil, fmt.Errorf("want a JSON object, got %T", v)
	}
	return o, nil
}

func decodeValue(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	switch tok {
	case json.Delim('{'):
		o := &object{}
		for dec.More() {
			key, err := dec.Token()
			if err != nil {
				return nil, err
			}
			v, err := decodeValue(dec)
			if err != nil {
				return nil, err
			}
			o.set(key.(string), v)
		}
		_, err := dec.Token() // '}'
		return o, err
	case json.Delim('['):
		a := []any{}
		for dec.More() {
			v, err := decodeValue(dec)
			if err != nil {
				return nil, err
			}
			a = append(a, v)
		}
		_, err := dec.Token() // ']'
		return a, err
	}
	return tok, nil // string, json.Number, bool or nil
}

// dumps encodes a tree value as Python's json.dumps does with its defaults.
func dumps(v any) []byte {
	return appendPyJSON(nil, v)
}

func appendPyJSON(dst []byte, v any) []byte {
	switch v := v.(type) {
	case nil:
		return append(dst, "null"...)
	case bool:
		return strconv.AppendBool(dst, v)
	case string:
		return appendPyString(dst, v)
	case json.Number:
		return append(dst, pyJSONNumber(v)...)
	case float64:
		return append(dst, pyJSONFloat(v)...)
	case *object:
		dst = append(dst, '{')
		for i, k := range v.keys {
			if i > 0 {
				dst = append(dst, ", "...)
			}
			dst = appendPyString(dst, k)
			dst = append(dst, ": "...)
			dst = appendPyJSON(dst, v.vals[i])
		}
		return append(dst, '}')
	case []any:
		dst = append(dst, '[')
		for i, e := range v {
			if i > 0 {
				dst = append(dst, ", "...)
			}
			dst = appendPyJSON(dst, e)
		}
		return append(dst, ']')
	}
	panic(fmt.Sprintf("taubench: cannot encode %T as JSON", v))
}

// appendPyString quotes s as json.dumps does with ensure_ascii=True.
func appendPyString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for _, r := range s {
		switch {
		case r == '"':
			dst = append(dst, `\"`...)
		case r == '\\':
			dst = append(dst, `\\`...)
		case r == '\n':
			dst = append(dst, `\n`...)
		case r == '\r':
			dst = append(dst, `\r`...)
		case r == '\t':
			dst = append(dst, `\t`...)
		case r == '\b':
			dst = append(dst, `\b`...)
		case r == '\f':
			dst = append(dst, `\f`...)
		case r >= 0x20 && r < 0x7f:
			dst = append(dst, byte(r))
		default:
			units := []rune{r}
			if r > 0xffff { // UTF-16 surrogate pair
				r -= 0x10000
				units = []rune{0xd800 + r>>10, 0xdc00 + r&0x3ff}
			}
			for _, u := range units {
				dst = append(dst, '\\', 'u', hex[u>>12&0xf], hex[u>>8&0xf], hex[u>>4&0xf], hex[u&0xf])
			}
		}
	}
	return append(dst, '"')
}

// isIntText reports whether a JSON number is written as an integer, which
// Python's json module decodes to int rather than float.
func isIntText(n json.Number) bool {
	return !strings.ContainsAny(string(n), ".eE")
}

// pyJSONNumber writes a decoded JSON number as json.dumps would: ints as
// written, floats in repr form ("47.80" becomes "47.8").
func pyJSONNumber(n json.Number) string {
	if isIntText(n) {
		if n == "-0" {
			return "0"
		}
		return string(n)
	}
	f, _ := strconv.ParseFloat(string(n), 64) // out of range gives ±Inf, as float() does
	return pyJSONFloat(f)
}

// pyJSONFloat writes a float as json.dumps does.
func pyJSONFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	return pyFloatRepr(f)
}

// pyFloatRepr formats f as Python's repr(float) (and str(float)) does: the
// shortest digits that round-trip, fixed notation for exponents from -4 to 15
// with at least one digit after the point, else d.ddde±XX.
func pyFloatRepr(f float64) string { return formatPyFloat(f, true, false) }

// formatPyFloat is Python's float formatting with the 'r' code; addDot0
// appends ".0" to integral fixed-notation values (repr does, the parts of a
// complex repr do not) and sign forces a '+' on non-negative values.
func formatPyFloat(f float64, addDot0, sign bool) string {
	var b strings.Builder
	if math.Signbit(f) && !math.IsNaN(f) {
		b.WriteByte('-')
		f = -f
	} else if sign {
		b.WriteByte('+')
	}
	switch {
	case math.IsNaN(f):
		b.WriteString("nan")
		return b.String()
	case math.IsInf(f, 0):
		b.WriteString("inf")
		return b.String()
	case f == 0:
		b.WriteString("0")
		if addDot0 {
			b.WriteString(".0")
		}
		return b.String()
	}
	mant, expText, _ := strings.Cut(strconv.FormatFloat(f, 'e', -1, 64), "e")
	exp, _ := strconv.Atoi(expText)
	digits := strings.Replace(mant, ".", "", 1)
	point := exp + 1 // digits[:point] is the integer part
	switch {
	case point <= -4 || point > 16:
		b.WriteString(digits[:1])
		if len(digits) > 1 {
			b.WriteByte('.')
			b.WriteString(digits[1:])
		}
		fmt.Fprintf(&b, "e%+03d", exp)
	case point <= 0:
		b.WriteString("0.")
		b.WriteString(strings.Repeat("0", -point))
		b.WriteString(digits)
	case point >= len(digits):
		b.WriteString(digits)
		b.WriteString(strings.Repeat("0", point-len(digits)))
		if addDot0 {
			b.WriteString(".0")
		}
	default:
		b.WriteString(digits[:point])
		b.WriteByte('.')
		b.WriteString(digits[point:])
	}
	return b.String()
}

// round2 rounds x to 2 decimals as Python's round(x, 2) does for a float:
// the exact binary value of x is rounded half-to-even, so 2.675 (really
// 2.67499999…) gives 2.67 and 0.125 (exact) gives 0.12. strconv's fixed
// precision formatting performs exactly that rounding.
func round2(x float64) float64 {
	if math.IsInf(x, 0) || math.IsNaN(x) {
		return x
	}
	r, err := strconv.ParseFloat(strconv.FormatFloat(x, 'f', 2, 64), 64)
	if err != nil {
		return x // unreachable: FormatFloat's output always parses
	}
	return r
}

// The helpers below do money arithmetic on tree numbers with Python's
// int/float semantics: ints stay ints (json.Number), anything involving a
// float becomes a float64. The data's gift-card balances are ints, and the
// reference writes them back as floats once money moves.

// toFloat converts a number to float64 as Python's float() does; non-numbers
// give 0.
func toFloat(v any) float64 {
	switch v := v.(type) {
	case float64:
		return v
	case json.Number:
		f, _ := strconv.ParseFloat(string(v), 64)
		return f
	}
	return 0
}

// bigInt returns the value of an int-valued json.Number.
func bigInt(v any) (*big.Int, bool) {
	n, ok := v.(json.Number)
	if !ok || !isIntText(n) {
		return nil, false
	}
	return new(big.Int).SetString(string(n), 10)
}

// addNum returns a + b.
func addNum(a, b any) any {
	if x, ok := bigInt(a); ok {
		if y, ok := bigInt(b); ok {
			return json.Number(x.Add(x, y).String())
		}
	}
	return toFloat(a) + toFloat(b)
}

// negNum returns -a.
func negNum(a any) any {
	if x, ok := bigInt(a); ok {
		return json.Number(x.Neg(x).String())
	}
	return -toFloat(a)
}

// subNum returns a - b (in IEEE arithmetic a-b and a+(-b) are the same).
func subNum(a, b any) any { return addNum(a, negNum(b)) }

// absNum returns abs(a).
func absNum(a any) any {
	if x, ok := bigInt(a); ok {
		return json.Number(x.Abs(x).String())
	}
	return math.Abs(toFloat(a))
}

// roundNum returns round(a, 2): ints unchanged, floats via round2.
func roundNum(a any) any {
	if _, ok := bigInt(a); ok {
		return a
	}
	return round2(toFloat(a))
}

// lessNum reports a < b.
func lessNum(a, b any) bool { return toFloat(a) < toFloat(b) }

// truthy reports Python truthiness of a tree value.
func truthy(v any) bool {
	switch v := v.(type) {
	case nil:
		return false
	case bool:
		return v
	case string:
		return v != ""
	case json.Number, float64:
		return toFloat(v) != 0
	case *object:
		return v != nil && len(v.keys) > 0
	case []any:
		return len(v) > 0
	}
	return true
}

// pyStrRepr formats s as Python's repr(str) does (the text of a KeyError).
func pyStrRepr(s string) string {
	quote := byte('\'')
	if strings.ContainsRune(s, '\'') && !strings.ContainsRune(s, '"') {
		quote = '"'
	}
	var b strings.Builder
	b.WriteByte(quote)
	for _, r := range s {
		switch {
		case r == rune(quote) || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte(quote)
	return b.String()
}
