package idem

import "github.com/idemkit/idem/idemcore"

// The key rules, documented on ErrInvalidKey, are the state machine's
// (idemcore): validateKey for new calls (Do, DoTx), validateStoredKey
// (the rules of every earlier version: non-empty, at most MaxKeyLen bytes,
// UTF-8) for operator calls, so that records stored under keys the later
// rules refuse stay reachable.

func validateKey(key string) error { return idemcore.ValidateKey(key) }

func validateStoredKey(key string) error { return idemcore.ValidateStoredKey(key) }

// ValidateKey checks key by the rules Do and DoTx apply to a new call's key
// (listed on ErrInvalidKey): nil, or an error wrapping ErrInvalidKey that
// names the rule broken. Adapters that store a hash of a client's key
// (KeyOf, a scope) check the client's key with it first, so that a key the
// engine refuses is refused in their hands too rather than hidden in the
// hash.
func ValidateKey(key string) error { return validateKey(key) }
