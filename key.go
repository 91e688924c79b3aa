package idem

import "github.com/idemkit/idem/idemcore"

// ValidateKey checks key by the rules Do and DoTx apply to a new call's key
// (listed on idemcore.ErrInvalidKey): nil, or an error wrapping
// ErrInvalidKey that names the rule broken. Adapters that store a hash of a
// client's key (KeyOf, a scope) check the client's key with it first.
func ValidateKey(key string) error { return idemcore.ValidateKey(key) }
