package idemcore

import (
	"errors"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// FuzzValidateKey checks both key rules against a model: the stored-key
// rule of every earlier version (non-empty, at most MaxKeyLen bytes, UTF-8)
// and the rule for new calls (also no white space at the ends, no Cc or Cf).
func FuzzValidateKey(f *testing.F) {
	for _, s := range []string{"", "k", "order-7f3a", "order 7f3a", strings.Repeat("k", 255), strings.Repeat("k", 256),
		"\xff", "é", " k", "k ", "   ", "\t\n", "\x00", "\ufeff", "k\u200bk", "\u00a0k", "k\u2028", "k\x7f"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		stored := key != "" && len(key) <= MaxKeyLen && utf8.ValidString(key)
		fresh := stored && strings.TrimSpace(key) == key &&
			!strings.ContainsFunc(key, func(r rune) bool { return unicode.In(r, unicode.Cc, unicode.Cf) })
		for _, c := range []struct {
			name  string
			err   error
			valid bool
		}{{"validateStoredKey", validateStoredKey(key), stored}, {"ValidateKey", ValidateKey(key), fresh}} {
			if c.valid != (c.err == nil) {
				t.Fatalf("%s(%q) = %v", c.name, key, c.err)
			}
			if c.err != nil && !errors.Is(c.err, ErrInvalidKey) {
				t.Fatalf("%s: error does not wrap ErrInvalidKey: %v", c.name, c.err)
			}
		}
	})
}

// TestRefusedRune checks refusedRune's ASCII shortcut against the Unicode
// tables for every rune.
func TestRefusedRune(t *testing.T) {
	for r := rune(0); r <= unicode.MaxRune; r++ {
		if got, want := refusedRune(r), unicode.In(r, unicode.Cc, unicode.Cf); got != want {
			t.Fatalf("refusedRune(%U) = %v, want %v", r, got, want)
		}
	}
}
