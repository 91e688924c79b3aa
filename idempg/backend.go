package idempg

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/internal/fault"
	"github.com/idemkit/idem/internal/goid"
)

// backend is the Postgres storage of one engine: idemcore.Backend over pgx, with
// fn's DoTx transaction a pgx.Tx.
type backend struct {
	pool     *pgxpool.Pool
	s        *settings
	owner    string
	ownsPool bool

	// offset is added to the database's clock in every statement that
	// reads it, and fake, if set, replaces that clock for the times of
	// records and messages ({now_ns}; leases keep now() and the offset):
	// the tests' ways to move the database clock (never set in production:
	// see export_test.go).
	offset func() time.Duration
	fake   func() time.Time

	commits chan struct{} // Committed's: capacity 1

	// inFn counts RunTx fns running; fnGoroutines holds their goroutine
	// ids, for Holding.
	inFn         atomic.Int32
	fnGoroutines sync.Map // uint64 → struct{}

	l *listener // LISTEN/NOTIFY; nil in PollOnly mode

	// outboxClaims holds the outbox claims this engine's dispatcher holds, by
	// seq (uint64 → outboxClaim): the token that fences Failed (outbox.go).
	outboxClaims sync.Map

	// Concurrent calls share statements and transactions (batch.go): Do's
	// claims of free keys and its completions, and DoTx calls (tx.go).
	claims    batcher[*claimReq]
	completes batcher[*completeReq]
	dotx      batcher[*txReq]

	closeOnce sync.Once
}

var _ idemcore.Backend[pgx.Tx] = (*backend)(nil)

// newBackend returns the backend over pool with s; the schema must be at
// SchemaVersion.
func newBackend(ctx context.Context, pool *pgxpool.Pool, s *settings, ownsPool bool) (*backend, error) {
	if m := pool.Config().ConnConfig.DefaultQueryExecMode; s.PollOnly && m != pgx.QueryExecModeExec && m != pgx.QueryExecModeSimpleProtocol {
		return nil, fmt.Errorf("%w: PollOnly needs a pool whose DefaultQueryExecMode is QueryExecModeExec or QueryExecModeSimpleProtocol (no prepared statements), not %v", ErrOptions, m)
	}
	if err := checkVersion(ctx, pool, s); err != nil {
		return nil, err
	}
	b := &backend{pool: pool, s: s, owner: instanceOwner(s.Owner), ownsPool: ownsPool, offset: s.clockOffset, fake: s.clock,
		commits: make(chan struct{}, 1)}
	conns := int(pool.Config().MaxConns)
	stmts := max(2, conns/stmtBatchShare)
	b.claims = batcher[*claimReq]{run: b.claimBatch, max: stmts, limit: maxStmtBatch}
	b.completes = batcher[*completeReq]{run: b.completeBatch, max: stmts, limit: maxStmtBatch}
	b.dotx = batcher[*txReq]{run: b.runBatch, max: max(2, conns/txBatchShare), limit: maxTxBatch}
	if !s.PollOnly {
		b.l = newListener(pool, s, b.notifiedOutbox)
	}
	return b, nil
}

// instanceOwner is the owner stored in the records this engine claims: the
// label (Options.Owner; empty: host and pid) and a random instance id, so
// that it is unique per engine. The engine treats a started record with its
// own owner as an interrupted execution of its own (Owner, expiredSQL), so
// two engines sharing a label must never share it (a pid is reused after a
// restart, and a service may give every replica one label).
func instanceOwner(label string) string {
	if label == "" {
		host, _ := os.Hostname()
		label = host + "/" + strconv.Itoa(os.Getpid())
	}
	var r [8]byte
	_, _ = rand.Read(r[:])
	return label + "/" + hex.EncodeToString(r[:])
}

// txOwner names the owner of a key held by another process's uncommitted
// DoTx transaction.
const txOwner = "a DoTx transaction of another process"

// Record columns, in the order scanRecord reads them.
const recordColumns = `key, fingerprint, state, attempt, fence, owner, lease_until, started_ns, completed_ns,
	retention_ns, kept_until_resolved, response, has_error, error_code, error_message`

// The database's clock judges every time the backend stores or compares,
// for every process alike (see doc.go, "Clocks"): leases by {now}, the
// transaction's now(); the times of records and messages (the *_ns
// columns) by {now_ns}, statement_timestamp() in Unix nanoseconds (whole
// microseconds), so that each statement of a long transaction (DoTx's
// claim, then its done write) is stamped when it runs, and a statement that
// reads it twice reads one value.

// now is the SQL for the database's clock of leases, the tests' offset
// added.
func (b *backend) now() string {
	if d := b.offsetNow(); d != 0 {
		return "(now() + interval '" + strconv.FormatInt(d.Microseconds(), 10) + " microseconds')"
	}
	return "now()"
}

// nowNs is the SQL for the database's clock of records and messages, Unix
// ns, the tests' offset added (or their clock instead).
func (b *backend) nowNs() string {
	if b.fake != nil {
		return strconv.FormatInt(toNs(b.fake()), 10) + "::bigint"
	}
	ts := "statement_timestamp()"
	if d := b.offsetNow(); d != 0 {
		ts = "(statement_timestamp() + interval '" + strconv.FormatInt(d.Microseconds(), 10) + " microseconds')"
	}
	return "((extract(epoch FROM " + ts + ") * 1000000)::bigint * 1000)"
}

func (b *backend) offsetNow() time.Duration {
	if b.offset == nil {
		return 0
	}
	return b.offset()
}

// sql returns q with {schema}, {now} and {now_ns} replaced.
func (b *backend) sql(q string) string {
	q = b.s.sql(q)
	if strings.Contains(q, "{now_ns}") {
		q = strings.ReplaceAll(q, "{now_ns}", b.nowNs())
	}
	return strings.ReplaceAll(q, "{now}", b.now())
}

// Clock reads the database's clock for the engine (idemcore.Info.Clock): the
// clock of every time the engine stamps or judges without a statement of
// its own to read it in.
func (b *backend) Clock(ctx context.Context) (time.Time, error) {
	var ns int64
	err := b.pool.QueryRow(ctx, b.sql(`SELECT {now_ns}`), b.s.args()...).Scan(&ns)
	return fromNs(ns), err
}

// leaseSQL is the SQL of a new lease's end.
func (b *backend) leaseSQL() string {
	return "(" + b.now() + " + interval '" + strconv.FormatInt(b.s.Lease.Microseconds(), 10) + " microseconds')"
}

// Info implements idemcore.Backend.
func (b *backend) Info() idemcore.Info {
	return idemcore.Info{Name: "postgres", Shared: true, Heartbeat: b.s.Heartbeat, Poll: b.s.PollInterval,
		PruneBatch: b.s.PruneBatch, ClaimTimeout: b.s.LockTimeout, ClaimRenew: b.s.Heartbeat, Transient: transient,
		Clock: b.Clock}
}

// Guard admits every call: no state of this backend refuses calls as a
// whole (a failed statement fails its call only).
func (b *backend) Guard() error { return nil }

// transient reports whether err carries a SQLSTATE that means "try again"
// rather than an outcome of fn: 55P03 lock_not_available (the engine's own
// lock_timeout), 40001 serialization_failure, 40P01 deadlock_detected. A
// DoTx fn returning such an error gets it back as idemcore.Retryable (see
// Engine.DoTx).
func transient(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	switch pe.Code {
	case "55P03", "40001", "40P01":
		return true
	}
	return false
}

// scanned is one record row as read.
type scanned struct {
	rec         idemcore.Record
	fence       int64
	owner       *string
	leaseUntil  *time.Time
	hasError    bool
	code, msg   []byte // bytea: any bytes (migration 3)
	fp          int64
	startedNs   int64
	completedNs int64
	retentionNs int64
}

func (r *scanned) dest() []any {
	return []any{&r.rec.Key, &r.fp, &r.rec.State, &r.rec.Attempt, &r.fence, &r.owner, &r.leaseUntil,
		&r.startedNs, &r.completedNs, &r.retentionNs, &r.rec.KeptUntilResolved, &r.rec.Response,
		&r.hasError, &r.code, &r.msg}
}

// record finishes r's Record.
func (r *scanned) record() (*idemcore.Record, error) {
	rec := r.rec
	rec.Fingerprint = uint64(r.fp)
	rec.StartedAt = fromNs(r.startedNs)
	rec.CompletedAt = fromNs(r.completedNs)
	rec.Retention = time.Duration(r.retentionNs)
	if r.hasError {
		rec.Err = &idemcore.Error{Code: string(r.code), Message: string(r.msg), Replayed: true} // a stored error is a replay's
	}
	if rec.State != idemcore.StateStarted && rec.State != idemcore.StateDone {
		return &idemcore.Record{Key: rec.Key}, fmt.Errorf("%w: key %q: state %d", idemcore.ErrCorrupt, rec.Key, rec.State)
	}
	return &rec, nil
}

// toNs and fromNs convert times to the bigint columns: the zero time is 0.
func toNs(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromNs(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// expiresNs is the end of r's own retention window (idemcore.Expiry), Unix
// ns; 0 for never.
func expiresNs(r *idemcore.Record) int64 { return toNs(idemcore.Expiry(r, 0)) }

// errFields are the stored error columns of r: bytea, never NULL, so that
// a code or message of any bytes (NUL, invalid UTF-8) is stored exactly.
func errFields(r *idemcore.Record) (has bool, code, msg []byte) {
	if r.Err == nil {
		return false, []byte{}, []byte{}
	}
	return true, append([]byte{}, r.Err.Code...), append([]byte{}, r.Err.Message...)
}

// storable reports whether key can be stored in a text column: valid UTF-8
// without NUL. Any other key (an operator's call for a key of the old rules)
// has no record here.
func storable(key string) bool { return utf8.ValidString(key) && strings.IndexByte(key, 0) < 0 }

// Lookup implements idemcore.Backend: one SELECT by key, which reads the
// database's clock too (at), by which the engine judges the record.
func (b *backend) Lookup(ctx context.Context, q idemcore.Lookup) (*idemcore.Record, time.Time, error) {
	if !storable(q.Key) {
		return nil, time.Time{}, nil
	}
	var (
		r  scanned
		at int64
	)
	err := b.pool.QueryRow(ctx, b.sql(`SELECT `+recordColumns+`, {now_ns} FROM {schema}.idem_records WHERE key = $1::text`), b.s.args(q.Key)...).Scan(append(r.dest(), &at)...)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, time.Time{}, nil
	}
	if err != nil {
		return nil, time.Time{}, err
	}
	rec, err := r.record()
	return rec, fromNs(at), err
}

// Owner implements idemcore.Backend: a started record is owned while its lease
// has not lapsed by the database's clock.
func (b *backend) Owner(ctx context.Context, rec *idemcore.Record) (idemcore.Ownership, error) {
	var (
		owner  string
		left   int64 // µs until the lease lapses; ≤ 0 once it has
		before = time.Now()
	)
	err := b.pool.QueryRow(ctx, b.sql(`SELECT owner, (extract(epoch FROM lease_until - {now}) * 1000000)::bigint
		FROM {schema}.idem_records WHERE key = $1::text AND state = 1 AND attempt = $2::integer AND started_ns = $3::bigint`),
		b.s.args(rec.Key, rec.Attempt, toNs(rec.StartedAt))...).Scan(&owner, &left)
	if errors.Is(err, pgx.ErrNoRows) {
		// The record changed since it was read: Claim says how.
		return idemcore.Ownership{}, nil
	}
	if err != nil {
		return idemcore.Ownership{}, err
	}
	if left <= 0 || owner == b.owner {
		// Lapsed; or claimed by this engine, whose calls the engine knows:
		// none runs for the key while it asks (it holds the key), so the
		// record is an interrupted execution of this engine's, recovered at
		// once, as on bbolt.
		return idemcore.Ownership{Owner: owner}, nil
	}
	return idemcore.Ownership{Owned: true, Owner: owner, Until: before.Add(time.Duration(left) * time.Microsecond)}, nil
}

// expiredSQL is the condition under which a stored row (its columns
// unqualified, or qualified by the table name in ON CONFLICT) may be
// replaced by a new claim: outside its retention window at the database's
// now (%[3]s, ns: the claim's own stamp) with the longer of its window and
// the engine's (%[2]s, ns), and not held by a live lease of another engine
// (%[4]s: this engine's own are interrupted executions).
const expiredSQL = `NOT (%[1]s.state = 1 AND %[1]s.kept_until_resolved)
	AND (CASE WHEN %[1]s.state = 2 THEN %[1]s.completed_ns ELSE %[1]s.started_ns END) + GREATEST(%[1]s.retention_ns, %[2]s) <= %[3]s
	AND (%[1]s.state = 2 OR %[1]s.lease_until <= {now} OR %[1]s.owner = %[4]s)`

// Claim implements idemcore.Backend.
func (b *backend) Claim(ctx context.Context, req idemcore.ClaimRequest) (idemcore.ClaimResult, error) {
	st := req.Started
	before := time.Now()
	var (
		fence int64
		left  int64
		err   error
	)
	if req.Prev == nil {
		r := &claimReq{st: st, done: make(chan struct{})}
		b.claims.do(r, r.done)
		fence, left, err = r.fence, r.left, r.err
		before = r.before
		if err == nil {
			st.StartedAt = fromNs(r.started)
		}
	} else {
		// Take over the interrupted execution, if it is still the stored
		// version and its lease has lapsed; stamped by the database, with
		// the longer of the two windows and the mark if either has it (the
		// evidence of the first unknown outcome lasts as long as it would
		// have, also if this attempt's process dies).
		p := req.Prev
		q := `UPDATE {schema}.idem_records SET fingerprint = $2::bigint, attempt = $3::integer,
			fence = nextval('{schema}.idem_fence'), owner = $4::text, lease_until = ` + b.leaseSQL() + `,
			started_ns = {now_ns}, retention_ns = GREATEST(retention_ns, $5::bigint),
			kept_until_resolved = kept_until_resolved OR $6::boolean,
			expires_ns = CASE WHEN kept_until_resolved OR $6::boolean THEN 0 ELSE {now_ns} + GREATEST(retention_ns, $5::bigint) END
		WHERE key = $1::text AND state = 1 AND attempt = $7::integer AND started_ns = $8::bigint AND (lease_until <= {now} OR owner = $4::text)
		RETURNING fence, (extract(epoch FROM lease_until - {now}) * 1000000)::bigint, started_ns`
		var startedNs int64
		err = b.writeRow(ctx, q, []any{st.Key, int64(st.Fingerprint), st.Attempt, b.owner,
			int64(st.Retention), st.KeptUntilResolved, p.Attempt, toNs(p.StartedAt)}, &fence, &left, &startedNs)
		if err == nil {
			st.StartedAt = fromNs(startedNs)
		}
	}
	switch {
	case err == nil:
		started := *st
		return idemcore.ClaimResult{Status: idemcore.Claimed, Claim: &idemcore.Claim{
			Key: st.Key, Fingerprint: st.Fingerprint, Token: idemcore.Fence(fence), Started: &started, Prev: req.Prev,
			LeaseUntil: before.Add(time.Duration(left) * time.Microsecond),
		}}, nil
	case isLockTimeout(err):
		// A DoTx transaction of another process holds the row (with Prev
		// nil: uncommitted, invisible to Lookup): the key is owned by a
		// live owner, so that the engine waits or fails fast and never
		// takes the key for free.
		return idemcore.ClaimResult{Status: idemcore.ClaimOwned, Ownership: idemcore.Ownership{Owned: true, Owner: txOwner}}, nil
	case !errors.Is(err, pgx.ErrNoRows):
		return idemcore.ClaimResult{}, err
	}
	// Not claimed: say why, from the row now stored.
	cur, at, err := b.Lookup(ctx, idemcore.Lookup{Key: st.Key})
	if err != nil {
		return idemcore.ClaimResult{}, err
	}
	if req.Prev != nil && cur != nil && cur.State == idemcore.StateStarted && cur.Attempt == req.Prev.Attempt && cur.StartedAt.Equal(req.Prev.StartedAt) {
		own, err := b.Owner(ctx, cur)
		if err != nil {
			return idemcore.ClaimResult{}, err
		}
		if own.Owned {
			return idemcore.ClaimResult{Status: idemcore.ClaimOwned, Ownership: own}, nil
		}
	}
	return idemcore.ClaimResult{Status: idemcore.ClaimChanged, Current: cur, At: at}, nil
}

// maxStmtBatch is the most claims or completions one statement carries.
const maxStmtBatch = 64

// claimReq is one claim of a free key (Claim with Prev nil), queued for or
// running in a batch.
type claimReq struct {
	st      *idemcore.Record // its StartedAt set to the database's stamp once claimed
	before  time.Time        // just before the statement was sent
	fence   int64
	left    int64 // µs of lease left, by the database's clock
	started int64 // the database's stamp, ns
	err     error // pgx.ErrNoRows when not claimed
	done    chan struct{}
}

// claimInsertSQL inserts started rows, or replaces rows that have expired
// but are not pruned yet, from the rows of src: a VALUES row of one claim's
// parameters, or an unnest of a batch's arrays, with the columns key, fp,
// attempt, ret, kept (the owner is $1). The database stamps their start.
func (b *backend) claimInsertSQL(src string) string {
	return `INSERT INTO {schema}.idem_records AS r (key, fingerprint, state, attempt, fence, owner, lease_until,
			started_ns, completed_ns, retention_ns, kept_until_resolved, expires_ns)
		SELECT u.key, u.fp, 1, u.attempt, nextval('{schema}.idem_fence'), $1::text, ` + b.leaseSQL() + `,
			{now_ns}, 0, u.ret, u.kept, CASE WHEN u.kept THEN 0 ELSE {now_ns} + u.ret END
		FROM ` + src + ` AS u(key, fp, attempt, ret, kept) ORDER BY u.key
		ON CONFLICT (key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, state = 1, attempt = EXCLUDED.attempt,
			fence = EXCLUDED.fence, owner = EXCLUDED.owner, lease_until = EXCLUDED.lease_until,
			started_ns = EXCLUDED.started_ns, completed_ns = 0, retention_ns = EXCLUDED.retention_ns,
			kept_until_resolved = EXCLUDED.kept_until_resolved, expires_ns = EXCLUDED.expires_ns,
			response = NULL, has_error = false, error_code = '', error_message = '', waiters = false
		WHERE ` + fmt.Sprintf(expiredSQL, "r", "EXCLUDED.retention_ns", "EXCLUDED.started_ns", "$1::text") + `
		RETURNING key, fence, (extract(epoch FROM lease_until - {now}) * 1000000)::bigint, started_ns`
}

// claimBatch claims the free keys of reqs: one statement for all (one
// round trip, one commit). A lone claim, and every claim of a batch whose
// statement waited out its lock_timeout (a DoTx transaction of another
// process holds one of the keys) or was chosen by the deadlock detector (that
// transaction waits for a key of the batch), is made alone, so that each
// learns whether its own key is held.
func (b *backend) claimBatch(reqs []*claimReq) {
	ctx := context.Background()
	if len(reqs) > 1 {
		n := len(reqs)
		keys, fps, attempts := make([]string, n), make([]int64, n), make([]int32, n)
		rets, kept := make([]int64, n), make([]bool, n)
		byKey := make(map[string]*claimReq, n)
		for i, r := range reqs {
			st := r.st
			keys[i], fps[i], attempts[i] = st.Key, int64(st.Fingerprint), int32(st.Attempt)
			rets[i], kept[i] = int64(st.Retention), st.KeptUntilResolved
			byKey[st.Key] = r
		}
		before := time.Now()
		var err error
		err = b.write(ctx, b.claimInsertSQL(`unnest($2::text[], $3::bigint[], $4::integer[], $5::bigint[], $6::boolean[])`),
			[]any{b.owner, keys, fps, attempts, rets, kept}, func(br pgx.BatchResults) error {
				rows, err := br.Query()
				if err != nil {
					return err
				}
				defer rows.Close()
				for rows.Next() {
					var (
						key                  string
						fence, left, started int64
					)
					if err := rows.Scan(&key, &fence, &left, &started); err != nil {
						return err
					}
					if r := byKey[key]; r != nil {
						r.fence, r.left, r.before, r.started = fence, left, before, started
						delete(byKey, key)
					}
				}
				return rows.Err()
			})
		if !isLockWait(err) {
			for _, r := range reqs {
				switch {
				case err != nil:
					r.err = err
				case byKey[r.st.Key] != nil:
					r.err = pgx.ErrNoRows // not claimed: a live record is there
				}
				close(r.done)
			}
			return
		}
	}
	for _, r := range reqs {
		st := r.st
		r.before = time.Now()
		var key string
		r.err = b.writeRow(ctx, b.claimInsertSQL(`(VALUES ($2::text, $3::bigint, $4::integer, $5::bigint, $6::boolean))`),
			[]any{b.owner, st.Key, int64(st.Fingerprint), st.Attempt, int64(st.Retention), st.KeptUntilResolved},
			&key, &r.fence, &r.left, &r.started)
		close(r.done)
	}
}

// Renew implements idemcore.Backend: it extends c's lease, fenced. A failure
// other than the fence is tried again, every quarter of a heartbeat, until
// the lease would lapse; then the last error is returned.
func (b *backend) Renew(ctx context.Context, c *idemcore.Claim) error {
	for {
		before := time.Now()
		var left int64
		err := b.writeRow(ctx, `UPDATE {schema}.idem_records SET lease_until = `+b.leaseSQL()+`
			WHERE key = $1::text AND fence = $2::bigint AND state = 1
			RETURNING (extract(epoch FROM lease_until - {now}) * 1000000)::bigint`, []any{c.Key, int64(c.Token)}, &left)
		if err == nil {
			c.LeaseUntil = before.Add(time.Duration(left) * time.Microsecond)
			return nil
		}
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: renewing the lease", idemcore.ErrFenced)
		}
		wait := b.s.Heartbeat / 4
		if time.Now().Add(wait).After(c.LeaseUntil) || ctx.Err() != nil {
			return fmt.Errorf("%w: %w", idemcore.ErrLeaseLost, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", idemcore.ErrLeaseLost, err)
		case <-time.After(wait):
		}
	}
}

// completeSQL replaces a started row held by token $2 with its done
// outcome, its completion stamped by the database's clock; the row keeps
// the start its claim stamped. completeStmt makes it answer both and notify
// the waiters of the key.
const completeSQL = `UPDATE {schema}.idem_records SET state = 2, owner = NULL, lease_until = NULL,
	attempt = $3::integer, completed_ns = {now_ns}, retention_ns = $4::bigint,
	kept_until_resolved = false, expires_ns = {now_ns} + $4::bigint, response = $5::bytea, has_error = $6::boolean,
	error_code = $7::bytea, error_message = $8::bytea
WHERE key = $1::text AND fence = $2::bigint AND state = 1`

// doneArgs are completeSQL's arguments $3 on.
func doneArgs(done *idemcore.Record) []any {
	has, code, msg := errFields(done)
	return []any{done.Attempt, int64(done.Retention), done.Response, has, code, msg}
}

// completeStmt is the fenced write q (completeSQL and its conditions),
// answering the row's stored times (started_ns, completed_ns) and a column
// to ignore (its notification of the key's waiters, unless PollOnly).
func (b *backend) completeStmt(q string) string {
	if b.s.PollOnly {
		return `WITH w AS (` + q + ` RETURNING started_ns, completed_ns) SELECT started_ns, completed_ns, NULL FROM w`
	}
	return `WITH w AS (` + q + ` RETURNING key, waiters, started_ns, completed_ns)
		SELECT started_ns, completed_ns, CASE WHEN waiters THEN pg_notify('` + b.s.channel() + `', key) END FROM w`
}

// stamped sets done's times to the row's, as the database stamped them.
func stamped(done *idemcore.Record, startedNs, completedNs int64) {
	done.StartedAt, done.CompletedAt = fromNs(startedNs), fromNs(completedNs)
}

// Complete implements idemcore.Backend: one fenced UPDATE. If its answer is
// lost (the connection dropped after the statement, and so its COMMIT, was
// sent), the record is read back by the claim's fencing token: done with
// that token means the write committed; anything else that it did not.
//
// Concurrent completions share one statement (an UPDATE from the unnest of
// their arrays: one round trip, one commit); a lone one runs alone.
//
// A completion that fails because its connection died (a server restart,
// a session ended by the server, a dropped TCP connection) is retried on a
// fresh connection (see again), so that a live claim's outcome is stored,
// not lost to a driver error.
func (b *backend) Complete(ctx context.Context, c *idemcore.Claim, done *idemcore.Record) error {
	return b.again(ctx, func() error {
		r := &completeReq{c: c, rec: done, done: make(chan struct{})}
		b.completes.do(r, r.done)
		if r.err == nil && !r.found {
			return fmt.Errorf("%w: completing the call", idemcore.ErrFenced)
		}
		return r.err
	}, func(cause error) error { return b.readBack(ctx, c, idemcore.StateDone, cause, done) })
}

// again runs the fenced write w, and runs it again while it fails because
// its connection failed (connLost), for at most one Lease from the first
// failure, backing off from 10ms to 1s: the pool replaces a dead connection
// with a fresh one. A write whose answer was lost after it may have reached
// the server (ambiguous) is first resolved by readBack (nil: it committed;
// an error wrapping ErrFenced: another claim holds the key; the cause
// itself: not committed, so write again). Writing again is safe: each write
// is fenced by the claim's token, so it never overwrites another claim's
// record, however late. The last error is returned.
func (b *backend) again(ctx context.Context, w func() error, readBack func(cause error) error) error {
	p := connPace{lease: b.s.Lease}
	for retried := false; ; retried = true {
		err := w()
		if retried && errors.Is(err, idemcore.ErrFenced) {
			// The write this one repeats arrived late and landed first
			// (the read back came before it): done with this claim's
			// token is the outcome; another token is a real fence.
			return readBack(err)
		}
		if err == nil || !connLost(err) {
			return err
		}
		if ambiguous(err) {
			if rerr := readBack(err); rerr == nil || errors.Is(rerr, idemcore.ErrFenced) {
				return rerr
			}
		}
		if !p.wait(ctx) {
			return err
		}
	}
}

// connLost reports whether err is the failure of a statement's connection,
// not the statement's: an error the server did not answer (a dropped or
// reset connection, a write on a dead one, pgx's "conn closed"), a
// connection exception (SQLSTATE class 08), an administrator's or crash
// shutdown (57P01, 57P02, 57P03), or any FATAL or PANIC error (the server
// ended the session). A context's end is not one.
func connLost(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		var ne net.Error
		var ce *pgconn.ConnectError
		return errors.As(err, &ne) || errors.As(err, &ce) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
			errors.Is(err, net.ErrClosed) || pgconn.SafeToRetry(err) || strings.Contains(err.Error(), "conn closed")
	}
	switch {
	case strings.HasPrefix(pe.Code, "08"), pe.Code == "57P01", pe.Code == "57P02", pe.Code == "57P03":
		return true
	}
	return pe.Severity == "FATAL" || pe.Severity == "PANIC"
}

// completeReq is one completion, queued for or running in a batch.
type completeReq struct {
	c     *idemcore.Claim
	rec   *idemcore.Record
	found bool // the row held c's token and is done now
	err   error
	done  chan struct{}
}

// completeBatch completes reqs in one statement, or a lone one alone.
func (b *backend) completeBatch(reqs []*completeReq) {
	ctx := context.Background()
	if len(reqs) == 1 {
		r := reqs[0]
		var (
			started, completed int64
			ignored            any
		)
		err := b.writeRow(ctx, b.completeStmt(completeSQL), append([]any{r.c.Key, int64(r.c.Token)}, doneArgs(r.rec)...), &started, &completed, &ignored)
		if err == nil {
			r.found = true
			stamped(r.rec, started, completed)
		} else if !errors.Is(err, pgx.ErrNoRows) {
			r.err = err
		}
		close(r.done)
		return
	}
	n := len(reqs)
	keys, fences, attempts := make([]string, n), make([]int64, n), make([]int32, n)
	rets, resps := make([]int64, n), make([][]byte, n)
	has, codes, msgs := make([]bool, n), make([][]byte, n), make([][]byte, n)
	byKey := make(map[string]*completeReq, n)
	for i, r := range reqs {
		d := r.rec
		keys[i], fences[i], attempts[i] = r.c.Key, int64(r.c.Token), int32(d.Attempt)
		rets[i], resps[i] = int64(d.Retention), d.Response
		has[i], codes[i], msgs[i] = errFields(d)
		byKey[r.c.Key] = r
	}
	q := `UPDATE {schema}.idem_records AS r SET state = 2, owner = NULL, lease_until = NULL,
			attempt = u.attempt, completed_ns = {now_ns}, retention_ns = u.ret,
			kept_until_resolved = false, expires_ns = {now_ns} + u.ret, response = u.resp, has_error = u.has,
			error_code = u.code, error_message = u.msg
		FROM unnest($1::text[], $2::bigint[], $3::integer[], $4::bigint[], $5::bytea[], $6::boolean[], $7::bytea[], $8::bytea[])
			AS u(key, fence, attempt, ret, resp, has, code, msg)
		WHERE r.key = u.key AND r.fence = u.fence AND r.state = 1
		RETURNING r.key, r.waiters, r.started_ns, r.completed_ns`
	if !b.s.PollOnly {
		q = `WITH w AS (` + q + `) SELECT key, started_ns, completed_ns, CASE WHEN waiters THEN pg_notify('` + b.s.channel() + `', key) END FROM w`
	} else {
		q = `WITH w AS (` + q + `) SELECT key, started_ns, completed_ns, NULL FROM w`
	}
	err := b.write(ctx, q, []any{keys, fences, attempts, rets, resps, has, codes, msgs}, func(br pgx.BatchResults) error {
		rows, err := br.Query()
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				key                string
				started, completed int64
				ignored            any
			)
			if err := rows.Scan(&key, &started, &completed, &ignored); err != nil {
				return err
			}
			if r := byKey[key]; r != nil {
				r.found = true
				stamped(r.rec, started, completed)
			}
		}
		return rows.Err()
	})
	for _, r := range reqs {
		r.err = err
		close(r.done)
	}
}

// readBack resolves a write whose outcome is unknown (cause) by reading the
// key's row: with c's token and state want, the write committed (nil; done,
// if not nil, gets the times the database stamped); with c's token and
// another state, it did not (cause); with another token or none, another
// owner took the key (ErrFenced).
func (b *backend) readBack(ctx context.Context, c *idemcore.Claim, want idemcore.State, cause error, done *idemcore.Record) error {
	var (
		fence              int64
		state              idemcore.State
		started, completed int64
	)
	err := b.readRow(ctx, `SELECT fence, state, started_ns, completed_ns FROM {schema}.idem_records WHERE key = $1::text`, []any{c.Key}, &fence, &state, &started, &completed)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("%w: the key's record is gone (the write's answer was lost: %v)", idemcore.ErrFenced, cause)
	case err != nil:
		return fmt.Errorf("the write's answer was lost (%w), and so was the read back: %v", cause, err)
	case idemcore.Fence(fence) != c.Token:
		return fmt.Errorf("%w: the write's answer was lost: %v", idemcore.ErrFenced, cause)
	case state == want:
		if done != nil {
			stamped(done, started, completed)
		}
		return nil
	}
	return cause
}

// connPace paces the tries of a statement whose connection failed (again,
// readRow): for at most one lease from the first failure, backing off from
// 10ms to 1s, while the pool replaces the dead connection.
type connPace struct {
	lease    time.Duration
	deadline time.Time
	backoff  time.Duration
}

// wait sleeps before the next try and reports whether to make it: false
// once the lease is used up or ctx ended.
func (p *connPace) wait(ctx context.Context) bool {
	if p.deadline.IsZero() {
		p.deadline, p.backoff = time.Now().Add(p.lease), 10*time.Millisecond
	}
	if !time.Now().Add(p.backoff).Before(p.deadline) {
		return false
	}
	select {
	case <-ctx.Done():
		return false
	case <-time.After(p.backoff):
	}
	p.backoff = min(2*p.backoff, time.Second)
	return true
}

// readRow reads one row of q (with {schema} and {now}) into dest for a
// read back, trying again on a fresh connection while its connection fails
// (connLost), for at most one Lease, backing off from 10ms to 1s: the
// server that lost a write's answer may be restarting.
func (b *backend) readRow(ctx context.Context, q string, args []any, dest ...any) error {
	p := connPace{lease: b.s.Lease}
	for {
		err := b.pool.QueryRow(ctx, b.sql(q), b.s.args(args...)...).Scan(dest...)
		if err == nil || !connLost(err) || errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		if !p.wait(ctx) {
			return err
		}
	}
}

// ambiguous reports whether err leaves a statement's outcome unknown: the
// connection failed after the statement may have reached the server. A
// FATAL error ends the session with the statement unanswered (the server
// may have ended it after a COMMIT it had not yet acknowledged), so it is
// ambiguous too; another error the server answered is the statement's own.
func ambiguous(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return connLost(err)
	}
	// pgconn.SafeToRetry cannot tell: a statement whose answer was lost to
	// an asynchronous read failure says "conn closed", safe to retry,
	// although it reached the server. A read back costs one query.
	return true
}

// notifying wraps a statement that changes a key's row ($1) so that it
// also notifies the key's waiters in other processes (delivered at commit),
// if the row says some wait (its waiters mark, set by WaitChange), unless
// PollOnly. The statement answers one row per row changed.
func (b *backend) notifying(q string) string {
	if b.s.PollOnly {
		return q
	}
	return `WITH w AS (` + q + ` RETURNING key, waiters) SELECT CASE WHEN waiters THEN pg_notify('` + b.s.channel() + `', key) END FROM w`
}

// exec runs the write q with args (see write) and returns the rows it
// changed (a notifying statement's rows count as its changed rows).
func (b *backend) exec(ctx context.Context, q string, args ...any) (tag pgconn.CommandTag, err error) {
	err = b.write(ctx, q, args, func(br pgx.BatchResults) error {
		tag, err = br.Exec()
		return err
	})
	return tag, err
}

// writeRow runs the write q with args (see write) and scans its one row
// into dest; no row gives pgx.ErrNoRows.
func (b *backend) writeRow(ctx context.Context, q string, args []any, dest ...any) error {
	return b.write(ctx, q, args, func(br pgx.BatchResults) error { return br.QueryRow().Scan(dest...) })
}

// limitSQL sets lock_timeout and idle_in_transaction_session_timeout for the
// current transaction only (is_local).
const limitSQL = `SELECT set_config('lock_timeout', $1::text, true), set_config('idle_in_transaction_session_timeout', $2::text, true)`

// write sends limitSQL and q in one batch: one round trip, and one implicit
// transaction, so that q's wait for a row lock (a DoTx transaction of
// another process holding the key) is bounded by Options.LockTimeout
// without session state (PgBouncer in transaction pooling mode keeps none).
func (b *backend) write(ctx context.Context, q string, args []any, read func(pgx.BatchResults) error) error {
	batch := &pgx.Batch{}
	batch.Queue(limitSQL, ms(b.s.LockTimeout), ms(b.s.IdleInTransactionTimeout))
	batch.Queue(b.sql(q), args...)
	br := b.pool.SendBatch(ctx, batch)
	_, err := br.Exec()
	if err == nil {
		err = read(br)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

// Release implements idemcore.Backend. Like Complete, it is written again on
// a fresh connection when its connection dies (again).
func (b *backend) Release(ctx context.Context, c *idemcore.Claim, restore *idemcore.Record) error {
	return b.again(ctx, func() error { return b.release(ctx, c, restore) },
		func(cause error) error { return b.readBackGone(ctx, c, restore == nil, cause) })
}

// release is one attempt of Release.
func (b *backend) release(ctx context.Context, c *idemcore.Claim, restore *idemcore.Record) error {
	var (
		tag pgconn.CommandTag
		err error
	)
	if restore == nil {
		tag, err = b.exec(ctx, b.notifying(`DELETE FROM {schema}.idem_records WHERE key = $1::text AND fence = $2::bigint AND state = 1`), c.Key, int64(c.Token))
	} else {
		// Back to the interrupted execution, with a lapsed lease and a
		// token nobody holds.
		tag, err = b.exec(ctx, b.notifying(`UPDATE {schema}.idem_records SET fingerprint = $3::bigint, attempt = $4::integer,
			fence = nextval('{schema}.idem_fence'), lease_until = 'epoch', started_ns = $5::bigint,
			retention_ns = $6::bigint, kept_until_resolved = $7::boolean, expires_ns = $8::bigint
		WHERE key = $1::text AND fence = $2::bigint AND state = 1`), c.Key, int64(c.Token), int64(restore.Fingerprint),
			restore.Attempt, toNs(restore.StartedAt), int64(restore.Retention), restore.KeptUntilResolved, expiresNs(restore))
	}
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: releasing the key", idemcore.ErrFenced)
	}
	return nil
}

// readBackGone resolves a Release whose answer was lost: the row is gone
// (deleted) or no longer holds c's token (restored), or the write did not
// happen (cause).
func (b *backend) readBackGone(ctx context.Context, c *idemcore.Claim, deleted bool, cause error) error {
	var fence int64
	err := b.readRow(ctx, `SELECT fence FROM {schema}.idem_records WHERE key = $1::text`, []any{c.Key}, &fence)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		if deleted {
			return nil
		}
		return fmt.Errorf("%w: the key's record is gone", idemcore.ErrFenced)
	case err != nil:
		return fmt.Errorf("the write's answer was lost (%w), and so was the read back: %v", cause, err)
	case idemcore.Fence(fence) == c.Token:
		return cause
	case deleted:
		return fmt.Errorf("%w: the write's answer was lost: %v", idemcore.ErrFenced, cause)
	}
	// Restored (a new token), or another owner's: the restore is the only
	// write that gives the row a token of no claim, and another owner's
	// claim fences this one either way.
	return nil
}

// isLockTimeout reports whether err is lock_timeout's (55P03).
func isLockTimeout(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "55P03"
}

// isLockWait reports whether err ended a wait for another transaction's
// row lock: lock_timeout's (55P03), or the deadlock detector's (40P01),
// which picks a statement that locks several keys (a batch of claims, a
// DoTx transaction) when two such wait for each other's keys.
func isLockWait(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "55P03" || pe.Code == "40P01")
}

// Holding implements idemcore.Backend: true on a goroutine running a RunTx fn.
func (b *backend) Holding() bool {
	if b.inFn.Load() == 0 {
		return false
	}
	_, ok := b.fnGoroutines.Load(goid.ID())
	return ok
}

// Forget implements idemcore.Backend: a started row whose lease another engine
// holds, unlapsed, is not deleted (ErrInProgress).
func (b *backend) Forget(ctx context.Context, key string) (bool, error) {
	if !storable(key) {
		return false, nil
	}
	tag, err := b.exec(ctx, b.notifying(`DELETE FROM {schema}.idem_records WHERE key = $1::text AND NOT `+liveElsewhereSQL), key, b.owner)
	if err != nil {
		return false, err
	}
	if tag.RowsAffected() > 0 {
		return true, nil
	}
	var held bool
	err = b.pool.QueryRow(ctx, b.sql(`SELECT `+liveElsewhereSQL+` FROM {schema}.idem_records WHERE key = $1::text`), b.s.args(key, b.owner)...).Scan(&held)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, nil
	case err != nil:
		return false, err
	case held:
		return false, fmt.Errorf("%w: a live call of another engine holds the key", idemcore.ErrInProgress)
	}
	return false, nil
}

// liveElsewhereSQL is true for a row (its columns unqualified) that is a
// started record whose lease, held by another engine than $2, has not
// lapsed: a call running elsewhere, which no operator write may touch.
const liveElsewhereSQL = `(state = 1 AND lease_until > {now} AND owner IS DISTINCT FROM $2::text)`

// Resolve implements idemcore.Backend: fn runs with the row locked (FOR
// UPDATE); its record replaces the row with a new token, so that a claim
// still running is fenced off. A started row whose lease another engine
// holds, unlapsed, is refused with ErrInProgress before fn runs.
func (b *backend) Resolve(ctx context.Context, key string, fn func(cur *idemcore.Record) (*idemcore.Record, error)) error {
	if !storable(key) {
		_, err := fn(nil)
		if err == nil {
			err = fmt.Errorf("%w: key %q cannot be stored in Postgres", idemcore.ErrInvalidKey, key)
		}
		return err
	}
	return b.inTx(ctx, pgx.TxOptions{}, func(tx pgx.Tx) error {
		var (
			r   scanned
			cur *idemcore.Record
		)
		var held bool
		err := tx.QueryRow(ctx, b.sql(`SELECT `+recordColumns+`, `+liveElsewhereSQL+` FROM {schema}.idem_records WHERE key = $1::text FOR UPDATE`),
			b.s.args(key, b.owner)...).Scan(append(r.dest(), &held)...)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return err
		case held:
			return fmt.Errorf("%w: a live call of another engine holds the key", idemcore.ErrInProgress)
		default:
			if cur, err = r.record(); err != nil {
				return err
			}
		}
		rec, err := fn(cur)
		if err != nil {
			return err
		}
		if rec == nil {
			_, err = tx.Exec(ctx, b.sql(b.notifying(`DELETE FROM {schema}.idem_records WHERE key = $1::text`)), b.s.args(key)...)
			return err
		}
		return b.put(ctx, tx, rec)
	})
}

// put stores rec in tx in place of any row of its key, with a new token
// and, for a started record, a lapsed lease (no live call holds it).
func (b *backend) put(ctx context.Context, tx pgx.Tx, rec *idemcore.Record) error {
	has, code, msg := errFields(rec)
	var owner, lease any
	if rec.State == idemcore.StateStarted {
		owner, lease = b.owner, "epoch"
	}
	_, err := tx.Exec(ctx, b.sql(b.notifying(`INSERT INTO {schema}.idem_records (key, fingerprint, state, attempt, fence, owner, lease_until,
			started_ns, completed_ns, retention_ns, kept_until_resolved, expires_ns, response, has_error, error_code, error_message)
		VALUES ($1::text, $2::bigint, $3::smallint, $4::integer, nextval('{schema}.idem_fence'), $5::text, $6::timestamptz,
			$7::bigint, $8::bigint, $9::bigint, $10::boolean, $11::bigint, $12::bytea, $13::boolean, $14::bytea, $15::bytea)
		ON CONFLICT (key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, state = EXCLUDED.state, attempt = EXCLUDED.attempt,
			fence = EXCLUDED.fence, owner = EXCLUDED.owner, lease_until = EXCLUDED.lease_until, started_ns = EXCLUDED.started_ns,
			completed_ns = EXCLUDED.completed_ns, retention_ns = EXCLUDED.retention_ns,
			kept_until_resolved = EXCLUDED.kept_until_resolved, expires_ns = EXCLUDED.expires_ns, response = EXCLUDED.response,
			has_error = EXCLUDED.has_error, error_code = EXCLUDED.error_code, error_message = EXCLUDED.error_message`)),
		b.s.args(rec.Key, int64(rec.Fingerprint), int16(rec.State), rec.Attempt, owner, lease,
			toNs(rec.StartedAt), toNs(rec.CompletedAt), int64(rec.Retention), rec.KeptUntilResolved, expiresNs(rec),
			rec.Response, has, code, msg)...)
	return err
}

// inTx runs fn in a transaction with the session limits set (SET LOCAL
// lock_timeout and idle_in_transaction_session_timeout), committing if it
// returns nil.
func (b *backend) inTx(ctx context.Context, opts pgx.TxOptions, fn func(tx pgx.Tx) error) error {
	return pgx.BeginTxFunc(ctx, b.pool, opts, func(tx pgx.Tx) error {
		if err := b.limit(ctx, tx); err != nil {
			return err
		}
		return fn(tx)
	})
}

// limit sets the transaction's lock_timeout and
// idle_in_transaction_session_timeout, for this transaction only.
//
// It also sets idem.schema to Options.Schema, so that a DoTx fn can find
// the engine's schema: current_setting('idem.schema').
func (b *backend) limit(ctx context.Context, tx pgx.Tx) error {
	_, err := b.limitXid(ctx, tx)
	return err
}

// limitXid is limit, returning the transaction's id (txid_current) from
// the same statement: one round trip.
func (b *backend) limitXid(ctx context.Context, tx pgx.Tx) (xid int64, err error) {
	err = tx.QueryRow(ctx, `SELECT txid_current() FROM (SELECT set_config('lock_timeout', $1::text, true), set_config('idle_in_transaction_session_timeout', $2::text, true),
		set_config('idem.schema', $3::text, true), set_config('idem.tx', 'on', true)) AS s`,
		b.s.args(ms(b.s.LockTimeout), ms(b.s.IdleInTransactionTimeout), b.s.Schema)...).Scan(&xid)
	return xid, err
}

// ms is d in whole milliseconds (at least 1), as a setting's text.
func ms(d time.Duration) string { return strconv.FormatInt(max(d.Milliseconds(), 1), 10) }

// Prune implements idemcore.Backend: DELETEs of at most req.Limit expired rows
// each, by the expiry index, until none is left.
func (b *backend) Prune(ctx context.Context, req idemcore.PruneRequest) (idemcore.PruneResult, error) {
	limit := req.Limit
	if limit <= 0 {
		limit = b.s.PruneBatch
	}
	var res idemcore.PruneResult
	now := toNs(req.Now)
	for {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		if err := fault.Err("prune-before-drop"); err != nil {
			return res, err // as a failed DELETE
		}
		rows, err := b.pool.Query(ctx, b.sql(`DELETE FROM {schema}.idem_records WHERE key IN (
				SELECT key FROM {schema}.idem_records AS r
				WHERE expires_ns > 0 AND expires_ns <= $1::bigint AND (NOT $3::boolean OR state = 2)
					AND `+fmt.Sprintf(expiredSQL, "r", "$2::bigint", "$1::bigint", "$5::text")+`
				ORDER BY expires_ns LIMIT $4::integer FOR UPDATE SKIP LOCKED)
			RETURNING state`), b.s.args(now, int64(req.Retention), req.KeepStarted, limit, b.owner)...)
		if err != nil {
			return res, err
		}
		states, err := pgx.CollectRows(rows, pgx.RowTo[int16])
		if err == nil {
			err = fault.Err("prune-after-drop") // as a DELETE whose answer was lost
		}
		if err != nil {
			return res, err
		}
		for _, s := range states {
			res.Deleted++
			if idemcore.State(s) == idemcore.StateStarted {
				res.Interrupted++
			}
		}
		if len(states) < limit {
			return res, nil
		}
	}
}

// Scan implements idemcore.Backend: one REPEATABLE READ transaction, by key.
func (b *backend) Scan(ctx context.Context, fn func(r *idemcore.Record, err error) error) error {
	return b.inTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, b.sql(`SELECT `+recordColumns+` FROM {schema}.idem_records ORDER BY key`), b.s.args()...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var r scanned
			if err := rows.Scan(r.dest()...); err != nil {
				return err
			}
			if err := fn(r.record()); err != nil {
				return err
			}
		}
		return rows.Err()
	})
}

// Committed implements idemcore.Backend.
func (b *backend) Committed() <-chan struct{} { return b.commits }

// committed wakes the dispatcher after a commit that may have enqueued,
// without blocking.
func (b *backend) committed() {
	select {
	case b.commits <- struct{}{}:
	default:
	}
}

// notifiedOutbox is the listener's callback for another process's enqueue.
func (b *backend) notifiedOutbox() { b.committed() }

// WaitChange implements idemcore.Backend: a notification for key, or one poll
// period, or the end of ctx.
//
// Unless PollOnly, it subscribes to key's notifications, then marks the
// started row as waited on (waiters), so that the change that ends it
// notifies. If the row is no longer started (the change came first) it
// returns at once. The mark waits for a change in progress (its row lock)
// at most LockTimeout; a mark that cannot be set leaves the wait to the
// poll period.
func (b *backend) WaitChange(ctx context.Context, key string) error {
	var ch <-chan struct{}
	if b.l != nil && storable(key) {
		var unsub func()
		ch, unsub = b.l.subscribe(key)
		defer unsub()
		tag, err := b.exec(ctx, `UPDATE {schema}.idem_records SET waiters = true WHERE key = $1::text AND state = 1`, key)
		switch {
		case err == nil && tag.RowsAffected() == 0:
			return nil // changed already: read it again
		case ctx.Err() != nil:
			return ctx.Err()
		}
	}
	t := time.NewTimer(b.s.PollInterval)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-ch:
	case <-t.C:
	}
	return nil
}

// Close implements idemcore.Backend.
//
// The engine calls it after its last call returned, so every started record
// this backend claimed is an interrupted execution: Close ends their leases
// (lease_until in the past), so that other processes recover them at once
// instead of waiting a lease out.
func (b *backend) Close() error {
	b.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), b.s.LockTimeout)
		_, _ = b.exec(ctx, `UPDATE {schema}.idem_records SET lease_until = 'epoch' WHERE owner = $1::text AND state = 1`, b.owner)
		cancel()
		if b.l != nil {
			b.l.close()
		}
		if b.ownsPool {
			b.pool.Close()
		}
	})
	return nil
}
