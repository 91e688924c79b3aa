package idemmcp

// The _meta entries the middleware reads and writes. The prefix is the
// reverse-DNS of the project's home (github.com/idemkit), as the MCP
// specification asks of _meta prefixes.
const (
	// MetaKey is the request _meta entry that carries the idempotency key:
	// a JSON string of 1 to 255 bytes of UTF-8, without white space at
	// either end or control or format characters (idemcore.ValidateKey). The key is read from there only (go-sdk drops unknown
	// fields of params), never from the JSON-RPC id, which differs between
	// a request and its retry.
	MetaKey = "io.github.idemkit/idempotency-key"
	// MetaReplayed is the result _meta entry, true, on a result answered
	// from the stored outcome rather than by running the tool.
	MetaReplayed = "io.github.idemkit/replayed"
	// MetaRecovered is the request _meta entry, true, by which a proxy in
	// front of a server tells it that the call recovers an interrupted
	// execution, so a key-aware server can reconcile. The middleware does
	// not read it: behind the middleware, a tool reads
	// idemcore.CallFrom(ctx).Recovered.
	MetaRecovered = "io.github.idemkit/recovered"
)
