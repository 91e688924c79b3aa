package idemmcp

// InProgressPolicy says what a duplicate does while the first call with its
// key runs in this middleware.
type InProgressPolicy uint8

const (
	// InProgressWait waits for the running call, at most Options.MaxWait
	// (then refuses as InProgressRefuse does), and answers with its outcome
	// as a replay. A waiter whose request is cancelled returns at once.
	InProgressWait InProgressPolicy = iota
	// InProgressRefuse refuses at once with CodeInProgress and retryAfter.
	InProgressRefuse
)

// KeySource says where a tool's idempotency key comes from.
type KeySource struct {
	kind keyKind
	args []string
}

type keyKind uint8

const (
	keyMeta keyKind = iota
	keyArgs
	keyNone
)

// KeyFromMeta takes the key from the request's _meta entry MetaKey: the
// agent framework mints it once per logical intent and sends it again on
// every retry. It is the zero KeySource.
var KeyFromMeta = KeySource{}

// NoKey passes the tool's calls through unprotected, as for read-only tools.
var NoKey = KeySource{kind: keyNone}

// KeyFromArgs makes a natural key from the named arguments (at least one):
// idem.KeyOf(tool name, each argument's canonical JSON, in the order given),
// so that two calls naming the same values are one intent whatever the
// client sends in _meta. A call missing one of them has no key. The tool's
// name is KeyOf's namespace: it must be 1 to idem.MaxNamespaceLen bytes.
func KeyFromArgs(names ...string) KeySource {
	if len(names) == 0 {
		panic("idemmcp: KeyFromArgs needs at least one argument name")
	}
	return KeySource{kind: keyArgs, args: append([]string(nil), names...)}
}

// Policy is how the middleware treats one tool.
type Policy struct {
	// Key is where the key comes from; the zero value is KeyFromMeta.
	Key KeySource
	// ReadOnly passes the tool's calls through: they have no effect to
	// protect. A tool registered with AddTool whose annotations carry
	// ReadOnlyHint is read-only too.
	ReadOnly bool
	// RunUnkeyed runs a call that has no key unprotected (a DoTx tool: in
	// its own transaction, under a fresh key of its own), instead of
	// refusing it with CodeKeyRequired. Such a call dedupes nothing.
	RunUnkeyed bool
}
