package idempg

import (
	"fmt"
	"math"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idemcore"
)

// Defaults for the zero values of Options.
const (
	// DefaultSchema is the schema that holds idem's tables.
	DefaultSchema = "public"
	// DefaultLease is how long a claim holds a key without a renewal,
	// measured by the database's clock (now()): a process stopped or cut
	// off holds a key at most this long, plus one Heartbeat.
	DefaultLease = 30 * time.Second
	// DefaultHeartbeat is how often the owner renews its claim while fn
	// runs, with the default Lease: a third of it, so that two renewals may
	// fail before the lease lapses.
	DefaultHeartbeat = DefaultLease / 3
	// DefaultPollInterval is how often a waiter re-reads a started record
	// owned by another process when no notification arrives, and how often
	// it reads in PollOnly mode.
	DefaultPollInterval = 250 * time.Millisecond
	// DefaultLockTimeout bounds every statement's wait for a row lock
	// (SET LOCAL lock_timeout), so that a stopped process holding locks
	// cannot block the others for ever.
	DefaultLockTimeout = 5 * time.Second
	// DefaultPruneBatch is the most rows one pruning statement deletes.
	DefaultPruneBatch = 1000
)

// Options are the Postgres backend's settings. The zero value of every field
// means its default; a nil *Options means all defaults.
type Options struct {
	// Schema is the schema that holds idem's tables (idem_records,
	// idem_outbox, idem_dead_letters, idem_migrations): a lower-case SQL
	// identifier, [a-z_][a-z0-9_]*, at most 63 bytes. Empty means
	// DefaultSchema. Migrate creates it if it does not exist.
	Schema string

	// Owner names this process in the records it claims (idem_records.owner),
	// for operators: a label, which several engines may share (every replica
	// of a service). Each engine stores it with "/" and a random instance id
	// of 16 hex digits appended, so that no two engines, with the same label
	// or not, take each other's live claims for their own. Empty means host
	// name and process id. It must be UTF-8
	// without NUL (a text column), else Open fails with ErrOptions.
	Owner string

	// Lease is how long a claim on a key lasts without a renewal, judged by
	// the database's clock (now()), never this machine's. Zero means
	// DefaultLease; it must be at least 1 second and at most INT_MAX
	// milliseconds (about 24.8 days: Postgres's timeout settings are int
	// milliseconds, and IdleInTransactionTimeout defaults to Lease), else
	// Open fails with ErrOptions.
	Lease time.Duration

	// Heartbeat is how often the owner renews a claim while fn runs (and a
	// dispatcher its running handlers' message claims), wall-clock. Zero
	// means Lease / 3 (DefaultHeartbeat with the default Lease); it must be
	// shorter than Lease. fn's context ends with cause idemcore.ErrLeaseLost at
	// the lease's end as last renewed, by this machine's monotonic clock
	// (read before the claim or the renewal was sent, so never later than
	// the end by the database's clock), or when a renewal is refused. Its
	// Err and Done judge that end on every call: fn resumed after a freeze
	// (SIGSTOP, a long GC pause, a starved scheduler) finds its context
	// ended on its first look, whichever goroutine runs first, and a
	// renewal that hangs (a blackholed connection) is not waited for. So fn
	// never runs on past its lease unknowingly while another process takes
	// the key over; what remains is in the root package's Caveats.
	//
	// A renewal takes a connection from the pool like any statement: size
	// the pool (MaxConns) above the DoTx calls that run at once (each holds
	// a connection while its fn runs) plus the Do calls that write at once,
	// or renewals wait for a connection and fns lose their leases.
	Heartbeat time.Duration

	// PollInterval is how often a call waiting for another process's call
	// re-reads its record, wall-clock: the fallback when a notification is
	// lost, and the only way in PollOnly mode. Zero means
	// DefaultPollInterval.
	PollInterval time.Duration

	// PollOnly makes the backend use no LISTEN/NOTIFY and no prepared
	// statements: waiters poll, and every statement is sent with
	// pgx.QueryExecModeExec (one unnamed statement per round trip, no
	// session state). It is what PgBouncer in transaction pooling mode
	// needs, and engines without LISTEN (CockroachDB; documented, not
	// tested here).
	PollOnly bool

	// LockTimeout is set as lock_timeout (SET LOCAL) in every transaction
	// the backend runs, DoTx's included: a statement that waits longer for
	// a lock fails (SQLSTATE 55P03; a DoTx fn returning that error gets
	// it back as idemcore.Retryable, nothing stored). Zero means DefaultLockTimeout; it must be between 1ms
	// and INT_MAX milliseconds (about 24.8 days), else ErrOptions.
	LockTimeout time.Duration

	// IdleInTransactionTimeout is set as idle_in_transaction_session_timeout
	// (SET LOCAL) in every transaction: the server ends a session whose
	// transaction sits idle longer (a stopped process inside DoTx's fn), so
	// that its row locks are released. Zero means Lease; it must be between
	// 1ms and INT_MAX milliseconds (about 24.8 days), else ErrOptions.
	//
	// It also ends a live DoTx whose fn spends longer than this between two
	// statements on tx (waiting for an HTTP call, say): the server closes the
	// session (SQLSTATE 25P03), fn's next statement on tx fails with a
	// connection error, nothing of the call commits, and the caller gets an
	// error (no outcome is stored, so a retry runs fn again). fn's context is
	// not cancelled for it. A DoTx fn that must wait that long needs a longer
	// IdleInTransactionTimeout, or Do instead of DoTx.
	IdleInTransactionTimeout time.Duration

	// PruneBatch is the most rows one pruning statement deletes, so that
	// pruning never holds many row locks at once. Zero means
	// DefaultPruneBatch.
	PruneBatch int

	// clockOffset, if set, is added to the database's clock wherever the
	// backend reads it; clock, if set, replaces that clock (tests only:
	// export_test.go).
	clockOffset func() time.Duration
	clock       func() time.Time
}

// maxTimeout is the longest Lease, LockTimeout and IdleInTransactionTimeout:
// Postgres's timeout settings are int milliseconds (INT_MAX ms, about 24.8
// days), and IdleInTransactionTimeout defaults to Lease.
const maxTimeout = math.MaxInt32 * time.Millisecond

// schemaName is what Options.Schema accepts: an identifier that needs no
// quoting, so that it reads the same in every tool.
var schemaName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// ErrOptions is wrapped by the error of a call given invalid Options, or
// invalid engine settings (idemcore.Options); it is idemcore.ErrOptions.
var ErrOptions = idemcore.ErrOptions

// settings are Options with every default filled in and checked.
type settings struct {
	Options
	schema string // the quoted schema, for SQL text
	mode   []any  // pgx.QueryExecModeExec in PollOnly mode, else nothing

	// The engine's retention window, for the claims the backend makes
	// inside DoTx's transaction (an expired row may be replaced).
	retention time.Duration
}

// channel is the NOTIFY channel of the schema's record changes; outbox
// wakes use channel() + "_outbox".
func (s *settings) channel() string {
	// A channel is an identifier: at most 63 bytes, with "_outbox" added.
	return "idem_" + s.Schema[:min(len(s.Schema), 50)]
}

// resolve fills in o's defaults and checks them.
func resolve(o *Options) (*settings, error) {
	s := &settings{}
	if o != nil {
		s.Options = *o
	}
	if s.Schema == "" {
		s.Schema = DefaultSchema
	}
	if !schemaName.MatchString(s.Schema) {
		return nil, fmt.Errorf("%w: Schema %q is not a lower-case SQL identifier ([a-z_][a-z0-9_]*, at most 63 bytes)", ErrOptions, s.Schema)
	}
	if !utf8.ValidString(s.Owner) || strings.IndexByte(s.Owner, 0) >= 0 {
		return nil, fmt.Errorf("%w: Owner %q is not UTF-8 text without NUL (Postgres text cannot hold it)", ErrOptions, s.Owner)
	}
	if s.Lease == 0 {
		s.Lease = DefaultLease
	}
	if s.Lease < time.Second || s.Lease > maxTimeout {
		return nil, fmt.Errorf("%w: Lease %v is not between 1s and %v (Postgres's INT_MAX ms)", ErrOptions, s.Lease, maxTimeout)
	}
	if s.Heartbeat == 0 {
		s.Heartbeat = s.Lease / 3
	}
	if s.Heartbeat <= 0 || s.Heartbeat >= s.Lease {
		return nil, fmt.Errorf("%w: Heartbeat %v must be positive and shorter than Lease %v", ErrOptions, s.Heartbeat, s.Lease)
	}
	if s.PollInterval == 0 {
		s.PollInterval = DefaultPollInterval
	}
	if s.PollInterval < 0 {
		return nil, fmt.Errorf("%w: PollInterval %v is negative", ErrOptions, s.PollInterval)
	}
	if s.LockTimeout == 0 {
		s.LockTimeout = DefaultLockTimeout
	}
	if s.LockTimeout < time.Millisecond || s.LockTimeout > maxTimeout {
		return nil, fmt.Errorf("%w: LockTimeout %v is not between 1ms and %v (Postgres's INT_MAX ms)", ErrOptions, s.LockTimeout, maxTimeout)
	}
	if s.IdleInTransactionTimeout == 0 {
		s.IdleInTransactionTimeout = s.Lease
	}
	if s.IdleInTransactionTimeout < time.Millisecond || s.IdleInTransactionTimeout > maxTimeout {
		return nil, fmt.Errorf("%w: IdleInTransactionTimeout %v is not between 1ms and %v (Postgres's INT_MAX ms)", ErrOptions, s.IdleInTransactionTimeout, maxTimeout)
	}
	if s.PruneBatch == 0 {
		s.PruneBatch = DefaultPruneBatch
	}
	if s.PruneBatch < 0 {
		return nil, fmt.Errorf("%w: PruneBatch %d is negative", ErrOptions, s.PruneBatch)
	}
	s.schema = pgx.Identifier{s.Schema}.Sanitize()
	if s.PollOnly {
		s.mode = []any{pgx.QueryExecModeExec}
	}
	return s, nil
}

// args prepends the query mode, if any, to a statement's arguments.
func (s *settings) args(a ...any) []any {
	if len(s.mode) == 0 {
		return a
	}
	return append(append(make([]any, 0, len(a)+1), s.mode...), a...)
}

// sql returns q with {schema} replaced by the quoted schema.
func (s *settings) sql(q string) string { return strings.ReplaceAll(q, "{schema}", s.schema) }
