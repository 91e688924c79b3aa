package idemmcp

import (
	"context"
	"log/slog"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Defaults for the zero values of Options.
const (
	// DefaultMaxWait bounds how long a duplicate waits for the running
	// call with its key (InProgressWait) before it is refused as in
	// progress.
	DefaultMaxWait = 30 * time.Second
	// DefaultRetryAfter is the retryAfter a refusal suggests.
	DefaultRetryAfter = time.Second
)

// Options configure New. A nil *Options means all defaults.
type Options struct {
	// Tools holds the policy of tools registered with the SDK directly
	// (mcp.AddTool or Server.AddTool); tools registered with this package's
	// AddTool, AddRawTool or AddTxTool carry their own. A tool in neither
	// has the zero Policy (key from _meta, refused without), unless the
	// server's tools/list (asked through the handlers below the middleware
	// on each call of such a tool) shows it annotated read-only
	// (ReadOnlyHint): then it passes through. A call of a tool the server
	// does not have passes through too, for the SDK to answer.
	Tools map[string]Policy
	// Scope, if set, returns the key space of a call: the authenticated
	// principal (from req.Extra.TokenInfo on an authenticated HTTP
	// transport; stdio and in-memory transports have none). The stored key
	// is then idemcore.KeyOf("idemmcp", scope, key), so that two principals
	// sending one key never meet and neither learns the other's key exists.
	// An error refuses the call with it and stores nothing.
	Scope func(ctx context.Context, req *mcp.CallToolRequest) (string, error)
	// InProgress is the policy for duplicates of a running call. Zero is
	// InProgressWait.
	InProgress InProgressPolicy
	// MaxWait bounds a duplicate's wait under InProgressWait, wall-clock.
	// Zero means DefaultMaxWait.
	MaxWait time.Duration
	// RetryAfter is the wait refusals suggest. Zero means DefaultRetryAfter.
	RetryAfter time.Duration
	// Logger receives a tool's panic (value and stack, at error level) and,
	// at warn level, a Do tool that ran but whose outcome the store failed
	// to record; keys and arguments are never logged. Nil discards.
	Logger *slog.Logger
}
