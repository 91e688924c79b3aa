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
// sku, day). The first part is the namespace, kept in clear so operators can
// tell keys apart; the key is the namespace, ":", and the 64 hex digits of the
// SHA-256 of all the parts, each prefixed with its length (uvarint), for
// example "create_order:9f86d081…". So:
//
//   - Different part lists give different keys, whatever the parts hold:
//     ("a|b", "c") and ("a", "b|c") differ, and so do ("a") and ("a", "").
//     Two lists meet only by a SHA-256 collision.
//   - The length is fixed: len(namespace) + 65 bytes, at most 129, valid as
//     a key (MaxKeyLen is 255) however long the parts are.
//   - The parts do not sit in the file in clear: people's ids do not belong in
//     keys. The trade-off: the key is not reversible, so an operator
//     reading the file (or `idem ls`) cannot tell which customer a key
//     belongs to, only recompute the key from known parts; and the hash is
//     not a secret: parts drawn from a small space (a phone number, a
//     sequential id) can be found by trying them all, so this is
//     pseudonymisation, not anonymisation. The namespace is stored in clear:
//     it must not hold personal data.
//
// KeyOf panics if parts is empty or the namespace is longer than
// MaxNamespaceLen bytes or breaks the key rules (see ErrInvalidKey: empty,
// not valid UTF-8, white space at either end, a control or format
// character): the namespace is meant to be a constant of the program, like a
// regexp given to MustCompile.
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
