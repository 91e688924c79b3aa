package idempg

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// AfterConnect returns a hook for pgxpool.Config.AfterConnect that sets the
// session's lock_timeout and idle_in_transaction_session_timeout to those
// of opts (LockTimeout and IdleInTransactionTimeout, defaults filled in as
// Open fills them) on each new connection of the pool, and marks the
// connection as set. An engine opened with the same settings then sends
// Do's claims and completions on such a connection without a setting of
// their own: each statement otherwise sets lock_timeout for its own
// transaction (a set_config in a CTE), which took 18-37 µs of a statement
// of about 400 µs on the bench machine (bench/RESULTS.md, "Issue 21: the
// row's own costs"). A connection not
// marked, or marked with other settings, gets the statements that carry
// their setting: the engine is correct either way.
//
// The settings are the session's, so they bound the lock waits and idle
// transactions of every statement the program sends on the pool, not only
// the engine's: give the engine a pool of its own, or one whose statements
// may all fail after LockTimeout of waiting for a lock (SQLSTATE 55P03). A
// program that changes lock_timeout on the pool's connections (SET, RESET
// ALL, DISCARD ALL, also inside a DoTx fn) must not use the hook.
//
// With opts.PollOnly (PgBouncer in transaction pooling mode, which keeps no
// session state for a client) the hook sets nothing and marks nothing: the
// statements carry their settings. It returns an error wrapping ErrOptions
// for opts that Open refuses, and the settings statement's error, if any,
// from the hook (pgxpool then closes the connection).
func AfterConnect(opts *Options) (func(ctx context.Context, conn *pgx.Conn) error, error) {
	s, err := resolve(opts)
	if err != nil {
		return nil, err
	}
	if s.PollOnly {
		return func(context.Context, *pgx.Conn) error { return nil }, nil
	}
	mark := s.sessionMark()
	return func(ctx context.Context, conn *pgx.Conn) error {
		if _, err := conn.Exec(ctx, `SELECT set_config('lock_timeout', $1::text, false), set_config('idle_in_transaction_session_timeout', $2::text, false)`,
			ms(s.LockTimeout), ms(s.IdleInTransactionTimeout)); err != nil {
			return fmt.Errorf("idempg: setting the session's lock_timeout: %w", err)
		}
		conn.PgConn().CustomData()[sessionKey] = mark
		return nil
	}, nil
}

// sessionKey is the key of AfterConnect's mark in a connection's
// CustomData: the settings it set (sessionMark).
const sessionKey = "idempg.session"

// sessionMark names the session settings of s, as AfterConnect marks a
// connection with them.
func (s *settings) sessionMark() string {
	return "lock_timeout=" + ms(s.LockTimeout) + ",idle_in_transaction_session_timeout=" + ms(s.IdleInTransactionTimeout)
}

// sessionSet reports whether conn's session has b's settings (AfterConnect
// with the same options), so that a statement on it needs none of its own.
func (b *backend) sessionSet(conn *pgx.Conn) bool {
	return !b.s.PollOnly && conn.PgConn().CustomData()[sessionKey] == b.mark
}

// onConn runs fn on a connection of the pool, with the statements for it:
// without settings of their own if its session has them (AfterConnect).
// session tells fn which it got (the statements' arguments differ: no
// lock_timeout parameter).
func (b *backend) onConn(ctx context.Context, fn func(conn *pgxpool.Conn, st *statements, session bool) error) error {
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if b.sessionSet(conn.Conn()) {
		return fn(conn, b.stmtsIn(true), true)
	}
	return fn(conn, b.stmtsIn(false), false)
}
