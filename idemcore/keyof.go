package idemcore

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
)

// MaxNamespaceLen is the longest namespace KeyOf accepts, in bytes, so that
// its keys stay well under MaxKeyLen.
const MaxNamespaceLen = 64

// KeyOf builds an idempotency key from domain parts, for calls whose key is
// natural rather than sent by the client: KeyOf("create_order", customerID,
// sku, day) returns the namespace (the first part, in clear), ":", and the 64
// hex digits of the SHA-256 of all the parts, each prefixed with its length
// (uvarint): "create_order:9f86d081…", at most 129 bytes. Different part
// lists give different keys; the package documentation ("Keys and
// fingerprints") says what the hash hides and what it does not.
//
// KeyOf panics if parts is empty or the namespace is longer than
// MaxNamespaceLen bytes or breaks the key rules (ErrInvalidKey): the
// namespace is a constant of the program, like a regexp given to
// MustCompile.
func KeyOf(parts ...string) string {
	if len(parts) == 0 {
		panic("idem: KeyOf needs a namespace")
	}
	ns := parts[0]
	if len(ns) > MaxNamespaceLen {
		panic(fmt.Sprintf("idem: KeyOf namespace must be at most %d bytes, got %d", MaxNamespaceLen, len(ns)))
	}
	if err := ValidateKey(ns); err != nil {
		panic(fmt.Sprintf("idem: KeyOf namespace: %v", err))
	}
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	for _, p := range parts {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(p)))])
		h.Write([]byte(p))
	}
	var sum [sha256.Size]byte
	return ns + ":" + hex.EncodeToString(h.Sum(sum[:0]))
}
