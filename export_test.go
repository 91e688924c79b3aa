package idem

import "github.com/idemkit/idem/idemcore"

// OpenWrapped is Open with the bbolt backend wrapped by wrap, for the
// conformance suite's test backends (idemtest.OwnedElsewhere).
func OpenWrapped(path string, opts *Options, wrap func(idemcore.Backend[*Tx]) idemcore.Backend[*Tx]) (*Engine, error) {
	return open(path, nil, opts, wrap)
}

// The bbolt file's bucket names and sequence keys (layout.go), for the
// external tests that damage a file by hand.
var RootName, OutboxName, DeadName = rootName, outboxName, deadName

// U64Key is u64Key: a message's key in the outbox and dead-letter buckets.
func U64Key(n uint64) []byte { return u64Key(n) }

// OpenFileWrapped is OpenWrapped with the file's settings, for the suite's
// run with the journal off.
func OpenFileWrapped(path string, file *BoltOptions, opts *Options, wrap func(idemcore.Backend[*Tx]) idemcore.Backend[*Tx]) (*Engine, error) {
	return open(path, file, opts, wrap)
}
