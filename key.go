package idem

import "github.com/idemkit/idem/internal/core"

// The key rules, documented on ErrInvalidKey, are the state machine's
// (internal/core): validateKey for new calls (Do, DoTx), validateStoredKey
// (the rules of every earlier version: non-empty, at most MaxKeyLen bytes,
// UTF-8) for operator calls, so that records stored under keys the later
// rules refuse stay reachable.

func validateKey(key string) error { return core.ValidateKey(key) }

func validateStoredKey(key string) error { return core.ValidateStoredKey(key) }
