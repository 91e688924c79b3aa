package idem

import core "github.com/idemkit/idem/idemcore"

// OpenWrapped is Open with the bbolt backend wrapped by wrap, for the
// conformance suite's test backends (idemtest.OwnedElsewhere).
func OpenWrapped(path string, opts *Options, wrap func(core.Backend[*Tx]) core.Backend[*Tx]) (*Engine, error) {
	return open(path, opts, wrap)
}
