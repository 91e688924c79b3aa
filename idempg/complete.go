package idempg

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idemcore"
)

// completeSQL replaces a started row held by token $2 with its done
// outcome, its completion stamped by the database's clock; the row keeps
// the start its claim stamped. completeStmt makes it answer both and notify
// the waiters of the key.
const completeSQL = completeSetSQL + ` WHERE ` + heldSQL

// completeSetSQL is completeSQL without its WHERE.
const completeSetSQL = `UPDATE {schema}.idem_records SET state = 2, owner = NULL, lease_until = NULL,
	attempt = $3::integer, completed_ns = {now_ns}, retention_ns = $4::bigint,
	kept_until_resolved = false, expires_ns = {now_ns} + $4::bigint, response = $5::bytea, has_error = $6::boolean,
	error_code = $7::bytea, error_message = $8::bytea`

// heldSQL finds the started row of key $1 held by fencing token $2, by the
// primary key: state <> 2 (a started row: the CHECK allows 1 and 2 only),
// not state = 1, which is the lease index's predicate, so that the planner
// never scans that index for the key (statistics taken before a burst of
// claims show it empty, while every claim since the last vacuum left an
// entry in it: TestKeyedWritesUseThePrimaryKey).
const heldSQL = `key = $1::text AND fence = $2::bigint AND state <> 2`

// doneArgs are completeSQL's arguments $3 on.
func doneArgs(done *idemcore.Record) []any {
	has, code, msg := errFields(done)
	return []any{done.Attempt, int64(done.Retention), done.Response, has, code, msg}
}

// completeStmt is the fenced write q (completeSQL and its conditions),
// answering the row's stored times (started_ns, completed_ns) and a column
// to ignore (its notification of the key's waiters, unless PollOnly).
func (b *backend) completeStmt(q string) string { return b.completeWith("", q, "") }

// completeWith is completeStmt with the CTE with (none if empty) before the
// write, and the columns extra (each after a comma) after its answer's.
//
// The answer is the UPDATE's own RETURNING, the notification in it: no
// CTE around the write, which cost the server about an eighth of a claim
// and completion's throughput at 8 callers (pgbench, bench/RESULTS.md,
// "Issue 21: cheaper statements").
func (b *backend) completeWith(with, q, extra string) string {
	if with != "" {
		with = `WITH ` + with + ` `
	}
	return with + q + ` RETURNING started_ns, completed_ns, ` + b.notifySQL("") + extra
}

// notifySQL is the column that notifies the waiters of the row written (its
// columns qualified by alias, if any), or NULL if PollOnly.
func (b *backend) notifySQL(alias string) string {
	if b.s.PollOnly {
		return "NULL"
	}
	if alias != "" {
		alias += "."
	}
	return `CASE WHEN ` + alias + `waiters THEN pg_notify('` + b.s.channel() + `', ` + alias + `key) END`
}

// completeOneSQL is a lone completion's statement (completeSQL, answering
// as completeStmt), lock_timeout in its own parameter $9 (limitCTE).
func (b *backend) completeOneSQL(l limit) string {
	return l.with() + b.completeWith("", completeSetSQL+l.from()+l.where(heldSQL), "")
}

// completeManySQL completes a batch from the unnest of its arrays ($1 to
// $8: key, fence, attempt, retention, response, has_error, code, message),
// lock_timeout in $9 (limitCTE), answering key, started_ns, completed_ns and
// a column to ignore (the notification of the key's waiters, unless
// PollOnly) per row completed.
func (b *backend) completeManySQL(l limit) string {
	return l.with() + `UPDATE {schema}.idem_records AS r SET state = 2, owner = NULL, lease_until = NULL,
			attempt = u.attempt, completed_ns = {now_ns}, retention_ns = u.ret,
			kept_until_resolved = false, expires_ns = {now_ns} + u.ret, response = u.resp, has_error = u.has,
			error_code = u.code, error_message = u.msg
		FROM unnest($1::text[], $2::bigint[], $3::integer[], $4::bigint[], $5::bytea[], $6::boolean[], $7::bytea[], $8::bytea[])
			AS u(key, fence, attempt, ret, resp, has, code, msg)` + l.join() + l.where(`r.key = u.key AND r.fence = u.fence AND r.state <> 2`) + `
		RETURNING r.key, r.started_ns, r.completed_ns, ` + b.notifySQL("r")
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
		if err := b.completes.do(ctx, r, r.done); err != nil {
			return err // not sent (the engine's ctx does not end: WithoutCancel)
		}
		if r.err == nil && !r.found {
			return fmt.Errorf("%w: completing the call", idemcore.ErrFenced)
		}
		return r.err
	}, func(cause error) error { return b.readBack(ctx, c, idemcore.StateDone, cause, done) })
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
	if b.observer != nil {
		defer observeBatch(b, time.Now(), reqs)
	}
	if len(reqs) == 1 {
		r := reqs[0]
		var started, completed int64
		err := b.onConn(ctx, func(conn *pgxpool.Conn, st *statements, session bool) error {
			args := append([]any{r.c.Key, int64(r.c.Token)}, doneArgs(r.rec)...)
			if !session {
				args = append(args, ms(b.s.LockTimeout))
			}
			return queryRow(ctx, conn, st.complete, b.s.args(args...), &started, &completed, nil) // nil: pg_notify's void
		})
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
	err := b.onConn(ctx, func(conn *pgxpool.Conn, st *statements, session bool) error {
		args := []any{keys, fences, attempts, rets, resps, has, codes, msgs}
		if !session {
			args = append(args, ms(b.s.LockTimeout))
		}
		rows, err := conn.Query(ctx, st.completeMany, b.s.args(args...)...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				key                string
				started, completed int64
			)
			if err := scanRow(rows, &key, &started, &completed, nil); err != nil { // nil: pg_notify's void
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

// failed reports whether the completion's statement failed or found no row
// of its claim (for observeBatch).
func (r *completeReq) failed() bool { return r.err != nil || !r.found }
