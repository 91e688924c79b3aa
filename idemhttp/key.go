package idemhttp

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/idemkit/idem/idemcore"
)

// The Idempotency-Key header: the key it carries, and the key stored.

// StoredKey is the key the middleware stores a request under when
// Options.Scope is set: idemcore.KeyOf("idemhttp", scope, key), the namespace
// "idemhttp", ":" and a SHA-256 of the scope and the client's key (so
// neither sits in the file in clear, and no two (scope, key) pairs meet).
// Operators compute it to find a client's key with Get, Forget or Resolve.
// Without Scope the stored key is the client's key itself.
func StoredKey(scope, key string) string { return idemcore.KeyOf(scopeNamespace, scope, key) }

// parseKey reads the Idempotency-Key header fields. It returns "" and no
// problem when there is none.
func parseKey(values []string) (string, *problem) {
	switch len(values) {
	case 0:
		return "", nil
	case 1:
	default:
		return "", problemKeyInvalid("the header appears more than once")
	}
	v := strings.Trim(values[0], " \t")
	if s, ok := parseSFString(v); ok {
		v = s
	}
	switch {
	case strings.TrimSpace(v) == "":
		return "", problemKeyInvalid("the key is empty")
	case len(v) > idemcore.MaxKeyLen:
		return "", problemKeyInvalid(fmt.Sprintf("the key is longer than %d bytes", idemcore.MaxKeyLen))
	case !utf8.ValidString(v):
		return "", problemKeyInvalid("the key is not valid UTF-8")
	case strings.IndexFunc(v, func(r rune) bool { return r < 0x20 || r == 0x7f }) >= 0:
		return "", problemKeyInvalid("the key holds control characters")
	}
	// The engine's rules (white space at an end, format characters), also
	// when Scope stores a hash of the key, which the engine cannot check.
	if err := idemcore.ValidateKey(v); err != nil {
		return "", problemKeyInvalid(strings.TrimPrefix(err.Error(), idemcore.ErrInvalidKey.Error()+": "))
	}
	return v, nil
}

// parseSFString parses v as a Structured Field String (RFC 8941 section
// 3.3.3): DQUOTE, printable ASCII with `"` and `\` escaped by `\`, DQUOTE,
// nothing after. It reports false for anything else, parameters included.
func parseSFString(v string) (string, bool) {
	if len(v) < 2 || v[0] != '"' {
		return "", false
	}
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i >= len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", false
			}
			b.WriteByte(v[i])
		case c == '"':
			if i != len(v)-1 {
				return "", false
			}
			return b.String(), true
		case c < 0x20 || c > 0x7e:
			return "", false
		default:
			b.WriteByte(c)
		}
	}
	return "", false // no closing quote
}
