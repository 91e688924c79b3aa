package idempg

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

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
