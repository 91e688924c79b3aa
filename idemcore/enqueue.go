package idemcore

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// ErrInvalidMessage is idem.ErrInvalidMessage: an outbox message's topic or
// ordering key that ValidateMessage refuses. Nothing is enqueued.
var ErrInvalidMessage = errors.New("invalid outbox message")

// MaxTopicLen is the longest outbox topic, in bytes (as for keys).
const MaxTopicLen = 255

// ValidateMessage checks an Enqueue's topic and ordering key, for every
// backend: the topic is 1 to MaxTopicLen bytes of UTF-8 without NUL, the
// ordering key (empty: the call's key) at most MaxKeyLen bytes of UTF-8
// without NUL. NUL is refused because Postgres text cannot hold it (the
// rule is the same on bbolt, so a program moves between backends unchanged).
// The error wraps ErrInvalidMessage.
func ValidateMessage(topic, orderingKey string) error {
	switch {
	case topic == "" || len(topic) > MaxTopicLen || !utf8.ValidString(topic) || strings.IndexByte(topic, 0) >= 0:
		return fmt.Errorf("%w: topic must be 1 to %d bytes of UTF-8 without NUL", ErrInvalidMessage, MaxTopicLen)
	case len(orderingKey) > MaxKeyLen || !utf8.ValidString(orderingKey) || strings.IndexByte(orderingKey, 0) >= 0:
		return fmt.Errorf("%w: ordering key must be at most %d bytes of UTF-8 without NUL", ErrInvalidMessage, MaxKeyLen)
	}
	return nil
}

// TruncateError cuts an error text to at most n bytes at a rune boundary
// (Message.LastError's "first 4 KiB"), so that the cut never leaves half a
// character. Invalid UTF-8 in s is kept as it is (backends store bytes).
func TruncateError(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n
	// Step back over continuation bytes to the start of the rune at n, at
	// most utf8.UTFMax-1 of them.
	for j := 0; j < utf8.UTFMax-1 && i > 0 && !utf8.RuneStart(s[i]); j++ {
		i--
	}
	if !utf8.RuneStart(s[i]) {
		// Not a valid sequence around n: cut bytes, nothing to keep whole.
		i = n
	} else if r, size := utf8.DecodeRuneInString(s[i:]); r == utf8.RuneError && size <= 1 {
		i = n
	}
	return s[:i]
}
