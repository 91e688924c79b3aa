package mcpproxy

import "github.com/idemkit/idem/idemmcp"

// Canonical returns the canonical JSON text of the JSON value data, the form
// of each argument in a natural key (Tool.KeyArgs): idemmcp.CanonicalJSON,
// the form idemmcp.Fingerprint and idemmcp.KeyFromArgs write, so the proxy
// and the middleware make one key of one call. Objects have their keys
// sorted (by bytes of UTF-8) at every depth, no insignificant space, strings
// re-encoded, and numbers as normalised decimals, so that 1, 1.0, 10e-1 and
// 0.1e1 give the same text while 9007199254740993 and 9007199254740992 stay
// distinct (no float64 rounding).
//
// It differs from idem.Fingerprint, which encodes Go values and keeps each
// number's JSON text (1 and 1.0 differ there): here the input is the JSON a
// client sent, and two clients may write one number two ways. It fails on
// input that is not one JSON value.
func Canonical(data []byte) ([]byte, error) { return idemmcp.CanonicalJSON(data) }
