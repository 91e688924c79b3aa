package idemcore

import (
	"fmt"
	"unicode"
	"unicode/utf8"
)

// The key rules, documented on ErrInvalidKey: ValidateKey for new calls,
// validateStoredKey (the rules of every earlier version) for operator calls,
// so that records stored under keys the later rules refuse stay reachable.

// ValidateKey checks key by the rules Do and DoTx apply to a new call's key
// (listed on ErrInvalidKey): nil, or an error wrapping ErrInvalidKey that
// names the rule broken. Adapters that store a hash of a client's key
// (KeyOf, a scope) check the client's key with it first, so that a key the
// engine refuses is refused in their hands too rather than hidden in the
// hash.
func ValidateKey(key string) error {
	if err := validateStoredKey(key); err != nil {
		return err
	}
	first, _ := utf8.DecodeRuneInString(key)
	last, _ := utf8.DecodeLastRuneInString(key)
	if unicode.IsSpace(first) || unicode.IsSpace(last) {
		return fmt.Errorf("%w: leading or trailing white space (refused, not trimmed)", ErrInvalidKey)
	}
	for i, r := range key {
		if refusedRune(r) {
			return fmt.Errorf("%w: control or format character %U at byte %d", ErrInvalidKey, r, i)
		}
	}
	return nil
}

// refusedRune reports whether r is a control or format character (Unicode
// categories Cc and Cf). ASCII, most keys' every rune, is judged without
// the tables' search, which cost a replay on Postgres 2–3 µs of its CPU
// for a 36-byte key: its only such runes are the controls below space and
// DEL.
func refusedRune(r rune) bool {
	if r < utf8.RuneSelf {
		return r < ' ' || r == 0x7f
	}
	return unicode.In(r, unicode.Cc, unicode.Cf)
}

// validateStoredKey checks a key for an operator call (Get, Forget,
// Resolve): the rules any stored record's key meets, non-empty, at most
// MaxKeyLen bytes, valid UTF-8.
func validateStoredKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	case len(key) > MaxKeyLen:
		return fmt.Errorf("%w: %d bytes, the limit is %d", ErrInvalidKey, len(key), MaxKeyLen)
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalidKey)
	}
	return nil
}

// MaxKeyLen is the longest idempotency key in bytes: Stripe's limit of 255
// characters, counted in bytes of UTF-8.
const MaxKeyLen = 255
