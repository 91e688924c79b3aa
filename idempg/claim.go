package idempg

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idemcore"
)

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
		found *foundRow
	)
	if req.Prev == nil {
		r := &claimReq{st: st, done: make(chan struct{})}
		if err := b.claims.do(ctx, r, r.done); err != nil {
			return idemcore.ClaimResult{}, err // not sent: nothing stored
		}
		fence, left, err, found = r.fence, r.left, r.err, r.found
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
		WHERE key = $1::text AND state <> 2 AND attempt = $7::integer AND started_ns = $8::bigint AND (lease_until <= {now} OR owner = $4::text)
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
	if req.Prev == nil && found != nil {
		// Not claimed: the claim's statement read the row stored.
		if found.err != nil {
			return idemcore.ClaimResult{}, found.err
		}
		return idemcore.ClaimResult{Status: idemcore.ClaimChanged, Current: found.rec, At: found.at}, nil
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

// claimReq is one claim of a free key (Claim with Prev nil), queued for or
// running in a batch.
type claimReq struct {
	st      *idemcore.Record // its StartedAt set to the database's stamp once claimed
	before  time.Time        // just before the statement was sent
	fence   int64
	left    int64 // µs of lease left, by the database's clock
	started int64 // the database's stamp, ns
	err     error // pgx.ErrNoRows when not claimed
	found   *foundRow
	done    chan struct{}
}

// foundRow is the row a claim found instead of claiming: the record as the
// claim's statement read it (its snapshot), at the database's clock then.
type foundRow struct {
	rec *idemcore.Record
	at  time.Time
	err error // the record does not decode (ErrCorrupt)
}

// claimFreshSQL claims the keys of src that no row holds: a plain INSERT …
// ON CONFLICT DO NOTHING, answering key, fence and started_ns per key
// claimed (the lease left is the whole lease: no column for it) (src, keys' order, owner and lock_timeout as
// in claimSQL). A key with a row, live or expired, is left alone (not
// locked, not written) for claimSQL to judge. It is the claim of a fresh
// key: against claimSQL's statement (a CTE around the INSERT, the row found
// read beside it), it ran about two thirds more claims per second at 8
// clients (pgbench, bench/RESULTS.md, "Issue 21: cheaper statements").
func (b *backend) claimFreshSQL(src string, l limit) string {
	return l.with() + `INSERT INTO {schema}.idem_records AS r (key, fingerprint, state, attempt, fence, owner, lease_until,
			started_ns, completed_ns, retention_ns, kept_until_resolved, expires_ns)
		SELECT u.key, u.fp, 1, u.attempt, nextval('{schema}.idem_fence'), $1::text, ` + b.leaseSQL() + `,
			{now_ns}, 0, u.ret, u.kept, CASE WHEN u.kept THEN 0 ELSE {now_ns} + u.ret END
		FROM ` + src + ` AS u(key, fp, attempt, ret, kept)` + l.join() + l.where("") + `
		ORDER BY u.key
		ON CONFLICT (key) DO NOTHING
		RETURNING key, fence, started_ns`
}

// claimSQL claims the free keys of src in one statement, which also answers,
// for each key it does not claim, the row stored as its snapshot saw it:
// one round trip whether the key is free or not (the engine decides again
// from the row found, without a Lookup of its own). src is a VALUES row of
// one claim's parameters or an unnest of a batch's arrays, with the columns
// key, fp, attempt, ret, kept; keys is the array of src's keys; the owner
// is $1, lock_timeout $7. It inserts started rows, or replaces rows that
// have expired but are not pruned yet; the database stamps their start.
//
// A key whose live row the snapshot holds is not inserted at all (NOT
// EXISTS): a replay or a conflict read through the claim writes nothing,
// locks no row and takes no transaction id, so its commit flushes no WAL
// (the engine claims first: Info.ClaimFirst). ON CONFLICT's DO UPDATE,
// which locks the row it meets even when its WHERE refuses it, is reached
// only by a key free or expired in the snapshot.
//
// The rows answered are: claimed, key, fence, µs of lease left, started_ns,
// then the columns of recordValues after started_ns and the database's
// clock (zero for a claimed row). A row another process inserted after the
// statement's snapshot (a race) blocks the claim and is not read: neither
// claimed nor found, the key is looked up (Claim).
func (b *backend) claimSQL(src, keys string, l limit) string {
	return l.with(`c AS (INSERT INTO {schema}.idem_records AS r (key, fingerprint, state, attempt, fence, owner, lease_until,
			started_ns, completed_ns, retention_ns, kept_until_resolved, expires_ns)
		SELECT u.key, u.fp, 1, u.attempt, nextval('{schema}.idem_fence'), $1::text, `+b.leaseSQL()+`,
			{now_ns}, 0, u.ret, u.kept, CASE WHEN u.kept THEN 0 ELSE {now_ns} + u.ret END
		FROM `+src+` AS u(key, fp, attempt, ret, kept)`+l.join()+l.where(`NOT EXISTS (SELECT 1 FROM {schema}.idem_records AS x WHERE x.key = u.key
				AND NOT (`+fmt.Sprintf(expiredSQL, "x", "u.ret", "{now_ns}", "$1::text")+`))`)+`
		ORDER BY u.key
		ON CONFLICT (key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, state = 1, attempt = EXCLUDED.attempt,
			fence = EXCLUDED.fence, owner = EXCLUDED.owner, lease_until = EXCLUDED.lease_until,
			started_ns = EXCLUDED.started_ns, completed_ns = 0, retention_ns = EXCLUDED.retention_ns,
			kept_until_resolved = EXCLUDED.kept_until_resolved, expires_ns = EXCLUDED.expires_ns,
			response = NULL, has_error = false, error_code = '', error_message = '', waiters = false
		WHERE `+fmt.Sprintf(expiredSQL, "r", "EXCLUDED.retention_ns", "EXCLUDED.started_ns", "$1::text")+`
		RETURNING key, fence, (extract(epoch FROM lease_until - {now}) * 1000000)::bigint AS left_us, started_ns)`) + `
	SELECT true, key, fence, left_us, started_ns, 0::bigint, 0::smallint, 0::integer, 0::bigint, 0::bigint, false,
		NULL::bytea, false, ''::bytea, ''::bytea, 0::bigint FROM c
	UNION ALL
	SELECT false, f.key, 0::bigint, 0::bigint, f.started_ns, f.fingerprint, f.state, f.attempt, f.completed_ns, f.retention_ns,
		f.kept_until_resolved, f.response, f.has_error, f.error_code, f.error_message, {now_ns}
	FROM {schema}.idem_records AS f WHERE f.key = ANY(` + keys + `) AND NOT EXISTS (SELECT 1 FROM c WHERE c.key = f.key)`
}

// claimBatch claims the free keys of reqs: one statement for all (one
// round trip, one commit), and a second for the keys it did not claim
// (claimAll). A lone claim, and every claim of a batch whose statement
// waited out its lock_timeout (a DoTx transaction of another process holds
// one of the keys) or was chosen by the deadlock detector (that transaction
// waits for a key of the batch), is made alone, so that each learns
// whether its own key is held.
func (b *backend) claimBatch(reqs []*claimReq) {
	ctx := context.Background()
	if b.observer != nil {
		defer observeBatch(b, time.Now(), reqs)
	}
	pending := reqs
	if len(reqs) > 1 {
		var err error
		if pending, err = b.claimAll(ctx, reqs); !isLockWait(err) {
			for _, r := range pending {
				r.err = err
			}
			for _, r := range reqs {
				close(r.done)
			}
			return
		}
		// Claimed by the batch's claimFreshSQL, which committed before
		// claimSQL failed for the others: answered, not sent again (each
		// would find its own started row).
		for _, r := range reqs {
			if !slices.Contains(pending, r) {
				close(r.done)
			}
		}
	}
	for _, r := range pending {
		if _, err := b.claimAll(ctx, []*claimReq{r}); err != nil {
			r.err = err
		}
		close(r.done)
	}
}

// claimAll claims the keys of reqs that are free: first by a plain insert
// of every key (claimFreshSQL), which claims a key no row holds, then, for
// the keys it did not claim, by claimSQL, which replaces an expired row
// and answers a live one. A fresh key, the common case of a claim sent
// before any lookup (Info.ClaimFirst), costs the cheap statement alone.
// The error is a statement's, and pending the requests that statement
// carried, unanswered (those the first claimed stand: it committed).
func (b *backend) claimAll(ctx context.Context, reqs []*claimReq) (pending []*claimReq, err error) {
	fresh, full := func(st *statements) string { return st.claimFreshOne }, func(st *statements) string { return st.claimOne }
	if len(reqs) > 1 {
		fresh, full = func(st *statements) string { return st.claimFreshMany }, func(st *statements) string { return st.claimMany }
	}
	if err := b.claimRows(ctx, fresh, reqs, true); err != nil {
		return reqs, err
	}
	var rest []*claimReq
	for _, r := range reqs {
		if r.err != nil {
			rest = append(rest, r)
		}
	}
	switch len(rest) {
	case 0:
		return nil, nil
	case 1:
		full = func(st *statements) string { return st.claimOne }
	}
	if err := b.claimRows(ctx, full, rest, false); err != nil {
		return rest, err
	}
	return nil, nil
}

// claimArgs are the claim statements' arguments for reqs: the owner, the
// keys' columns (one claim's values, or a batch's arrays) and, unless the
// session has it (AfterConnect), lock_timeout.
func (b *backend) claimArgs(reqs []*claimReq, session bool) []any {
	var args []any
	if len(reqs) == 1 {
		st := reqs[0].st
		args = []any{b.owner, st.Key, int64(st.Fingerprint), st.Attempt, int64(st.Retention), st.KeptUntilResolved}
	} else {
		n := len(reqs)
		keys, fps, attempts := make([]string, n), make([]int64, n), make([]int32, n)
		rets, kept := make([]int64, n), make([]bool, n)
		for i, r := range reqs {
			st := r.st
			keys[i], fps[i], attempts[i] = st.Key, int64(st.Fingerprint), int32(st.Attempt)
			rets[i], kept[i] = int64(st.Retention), st.KeptUntilResolved
		}
		args = []any{b.owner, keys, fps, attempts, rets, kept}
	}
	if !session {
		args = append(args, ms(b.s.LockTimeout))
	}
	return b.s.args(args...)
}

// claimRows runs the claim statement q picks (claimSQL, or claimFreshSQL
// if fresh) for reqs and answers each of them from its rows: claimed
// (fence, lease, stamp), or err pgx.ErrNoRows with the row found, if read.
// The error is the statement's.
func (b *backend) claimRows(ctx context.Context, q func(*statements) string, reqs []*claimReq, fresh bool) error {
	byKey := make(map[string]*claimReq, len(reqs))
	for _, r := range reqs {
		r.fence, r.left, r.started, r.found, r.err = 0, 0, 0, nil, pgx.ErrNoRows
		byKey[r.st.Key] = r
	}
	return b.onConn(ctx, func(conn *pgxpool.Conn, st *statements, session bool) error {
		before := time.Now()
		rows, err := conn.Query(ctx, q(st), b.claimArgs(reqs, session)...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				claimed     bool
				fence, left int64
				f           scanned
				at          int64
			)
			var err error
			if fresh {
				// The lease it took is Lease long by the database's clock,
				// now: the statement's lease_until is now() + Lease.
				claimed, left = true, b.s.Lease.Microseconds()
				err = scanRow(rows, &f.rec.Key, &fence, &f.startedNs)
			} else {
				err = scanRow(rows, &claimed, &f.rec.Key, &fence, &left, &f.startedNs, &f.fp, &f.state, &f.rec.Attempt,
					&f.completedNs, &f.retentionNs, &f.rec.KeptUntilResolved, &f.rec.Response, &f.hasError, &f.code, &f.msg, &at)
			}
			if err != nil {
				return err
			}
			r := byKey[f.rec.Key]
			if r == nil {
				continue
			}
			r.before = before
			if claimed {
				r.fence, r.left, r.started, r.err = fence, left, f.startedNs, nil
				continue
			}
			rec, err := f.record()
			r.found = &foundRow{rec: rec, at: fromNs(at), err: err}
		}
		return rows.Err()
	})
}

// failed reports whether the claim was not made: its statement failed, or
// it found the key held (for observeBatch).
func (r *claimReq) failed() bool { return r.err != nil || r.found != nil }

// observeBatch reports the requests of a batch whose statement committed
// as one EventCommit (observeCommit).
func observeBatch[R interface{ failed() bool }](b *backend, t0 time.Time, reqs []R) {
	n := 0
	for _, r := range reqs {
		if !r.failed() {
			n++
		}
	}
	b.observeCommit(t0, n)
}
