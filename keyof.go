package idem

import "github.com/idemkit/idem/idemcore"

// MaxNamespaceLen is the longest namespace KeyOf accepts, in bytes.
const MaxNamespaceLen = idemcore.MaxNamespaceLen

// KeyOf builds an idempotency key from domain parts, for calls whose key is
// natural rather than sent by the client: KeyOf("create_order", customerID,
// sku, day) is "create_order:" and the hex SHA-256 of the parts
// (idemcore.KeyOf gives the rules and what the hash does and does not hide).
// It panics on an empty parts or a bad namespace.
func KeyOf(parts ...string) string { return idemcore.KeyOf(parts...) }
