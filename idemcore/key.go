package idemcore

import (
	"fmt"
	"unicode"
	"unicode/utf8"
)

// The key rules, documented on idem.ErrInvalidKey: ValidateKey for new calls,
// ValidateStoredKey (the rules of every earlier version) for operator calls,
// so that records stored under keys the later rules refuse stay reachable.

// ValidateKey checks a key for a new call (Do, DoTx): every key rule.
func ValidateKey(key string) error {
	if err := ValidateStoredKey(key); err != nil {
		return err
	}
	first, _ := utf8.DecodeRuneInString(key)
	last, _ := utf8.DecodeLastRuneInString(key)
	if unicode.IsSpace(first) || unicode.IsSpace(last) {
		return fmt.Errorf("%w: leading or trailing white space (refused, not trimmed)", ErrInvalidKey)
	}
	for i, r := range key {
		if unicode.In(r, unicode.Cc, unicode.Cf) {
			return fmt.Errorf("%w: control or format character %U at byte %d", ErrInvalidKey, r, i)
		}
	}
	return nil
}

// ValidateStoredKey checks a key for an operator call (Get, Forget,
// Resolve): the rules any stored record's key meets, non-empty, at most
// MaxKeyLen bytes, valid UTF-8.
func ValidateStoredKey(key string) error {
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
// characters, counted in bytes of UTF-8 (idem.MaxKeyLen).
const MaxKeyLen = 255
