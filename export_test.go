package idem

import "github.com/idemkit/idem/idemcore"

// OpenWrapped is Open with the bbolt backend wrapped by wrap, for the
// conformance suite's test backends (idemtest.OwnedElsewhere).
func OpenWrapped(path string, opts *Options, wrap func(idemcore.Backend[*Tx]) idemcore.Backend[*Tx]) (*Engine, error) {
	return open(path, opts, wrap)
}
