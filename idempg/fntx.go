package idempg

import (
	"context"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/idemcore"
)

// errFnEndsTx is the error of a DoTx fn's Commit or Rollback of the
// transaction it was given.
var errFnEndsTx = fmt.Errorf("%w: tx.Commit and tx.Rollback refuse", ErrTxEnded)

// fnTx is the transaction a DoTx fn receives: the batch's, without Commit
// and Rollback, and with statements refused once fn's context ended or fn
// returned (idemcore.ErrTxClosed).
type fnTx struct {
	pgx.Tx
	nested bool // a savepoint fn began: its Commit and Rollback are fn's
	mu     sync.Mutex
	ended  bool
}

func (t *fnTx) end() {
	t.mu.Lock()
	t.ended = true
	t.mu.Unlock()
}

// use checks that a statement may be sent with ctx, and returns the context
// to send it with: ctx without its cancellation (see RunTx).
func (t *fnTx) use(ctx context.Context) (context.Context, error) {
	t.mu.Lock()
	ended := t.ended
	t.mu.Unlock()
	if ended {
		return nil, fmt.Errorf("%w: the DoTx fn returned", idemcore.ErrTxClosed)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return context.WithoutCancel(ctx), nil
}

// Begin starts a nested transaction: a savepoint of the batch's.
func (t *fnTx) Begin(ctx context.Context) (pgx.Tx, error) {
	c, err := t.use(ctx)
	if err != nil {
		return nil, err
	}
	nt, err := t.Tx.Begin(c)
	if err != nil {
		return nil, err
	}
	return &fnTx{Tx: nt, nested: true}, nil
}

// Commit and Rollback fail with errFnEndsTx, unless t is a savepoint fn
// began: the transaction is the engine's.
func (t *fnTx) Commit(ctx context.Context) error {
	if !t.nested {
		return errFnEndsTx
	}
	c, err := t.use(ctx)
	if err != nil {
		return err
	}
	return t.Tx.Commit(c)
}

func (t *fnTx) Rollback(ctx context.Context) error {
	if !t.nested {
		return errFnEndsTx
	}
	return t.Tx.Rollback(context.WithoutCancel(ctx))
}

func (t *fnTx) CopyFrom(ctx context.Context, name pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	c, err := t.use(ctx)
	if err != nil {
		return 0, err
	}
	return t.Tx.CopyFrom(c, name, cols, src)
}

func (t *fnTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	c, err := t.use(ctx)
	if err != nil {
		return errBatch{err}
	}
	return t.Tx.SendBatch(c, b)
}

func (t *fnTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	c, err := t.use(ctx)
	if err != nil {
		return nil, err
	}
	return t.Tx.Prepare(c, name, sql)
}

func (t *fnTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	c, err := t.use(ctx)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	return t.Tx.Exec(c, sql, args...)
}

func (t *fnTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	c, err := t.use(ctx)
	if err != nil {
		return nil, err
	}
	return t.Tx.Query(c, sql, args...)
}

func (t *fnTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	c, err := t.use(ctx)
	if err != nil {
		return errRow{err}
	}
	return t.Tx.QueryRow(c, sql, args...)
}

// errRow and errBatch carry an error refused before sending.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

type errBatch struct{ err error }

func (b errBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b errBatch) Query() (pgx.Rows, error)         { return nil, b.err }
func (b errBatch) QueryRow() pgx.Row                { return errRow(b) }
func (b errBatch) Close() error                     { return b.err }
func (b errBatch) Tx() pgx.Tx                       { return nil }
