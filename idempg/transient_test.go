package idempg_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idempg/internal/pgtest"
)

// TestDoTxTransientSQLStates: a DoTx fn that returns the error of one of
// its statements whose SQLSTATE means "try again" (55P03 from the engine's
// own lock_timeout, 40001 serialization_failure, 40P01 deadlock_detected)
// gets an error that is idemcore.Retryable: nothing is stored, the key stays
// free, and the next call runs fn again (here: succeeds once the lock is
// gone). Other SQL errors stay permanent outcomes.
func TestDoTxTransientSQLStates(t *testing.T) {
	st := newStore(t, pgtest.Env)
	st.opts.LockTimeout = 200 * time.Millisecond
	e := st.open(t, nil)
	ctx := context.Background()
	accounts := st.opts.Schema + ".accounts"
	if _, err := st.pool.Exec(ctx, "CREATE TABLE "+accounts+" (id int PRIMARY KEY, balance int); INSERT INTO "+accounts+" VALUES (1, 100)"); err != nil {
		t.Fatal(err)
	}
	blocker, err := st.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = blocker.Rollback(ctx) }() // before the pool closes, whatever fails
	if _, err := blocker.Exec(ctx, "SELECT * FROM "+accounts+" WHERE id = 1 FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	runs := 0
	debit := func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		runs++
		if _, err := tx.Exec(ctx, "SELECT * FROM "+accounts+" WHERE id = 1 FOR UPDATE"); err != nil {
			return nil, err
		}
		_, err := tx.Exec(ctx, "UPDATE "+accounts+" SET balance = balance - 10 WHERE id = 1")
		return []byte("debited"), err
	}
	_, err = e.DoTx(ctx, "debit-1", nil, debit)
	var pe *pgconn.PgError
	if !errors.Is(err, idemcore.ErrRetryable) || !errors.As(err, &pe) || pe.Code != "55P03" {
		t.Fatalf("DoTx meeting lock_timeout: %v, want Retryable wrapping SQLSTATE 55P03", err)
	}
	if _, gerr := e.Get("debit-1"); !errors.Is(gerr, idemcore.ErrNotFound) {
		t.Fatalf("after a lock_timeout the key holds a record: %v", gerr)
	}
	if err := blocker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := e.DoTx(ctx, "debit-1", nil, debit)
	if err != nil || string(res.Response) != "debited" || res.Replayed || runs != 2 {
		t.Fatalf("the retry once the lock is gone: %+v, %v, runs %d", res, err, runs)
	}

	// Serialization failure and deadlock, raised by fn's own statement.
	for _, code := range []string{"40001", "40P01"} {
		key := "raise-" + code
		_, err := e.DoTx(ctx, key, nil, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			_, err := tx.Exec(ctx, "DO $$ BEGIN RAISE EXCEPTION 'try again' USING ERRCODE = '"+code+"'; END $$")
			return nil, err
		})
		if !errors.Is(err, idemcore.ErrRetryable) {
			t.Errorf("SQLSTATE %s: %v, want Retryable", code, err)
		}
		if _, gerr := e.Get(key); !errors.Is(gerr, idemcore.ErrNotFound) {
			t.Errorf("SQLSTATE %s: the key holds a record: %v", code, gerr)
		}
	}
	// A constraint violation is fn's permanent outcome.
	_, err = e.DoTx(ctx, "dup", nil, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		_, err := tx.Exec(ctx, "INSERT INTO "+accounts+" VALUES (1, 0)")
		return nil, err
	})
	var ie *idemcore.Error
	if !errors.As(err, &ie) || errors.Is(err, idemcore.ErrRetryable) {
		t.Fatalf("unique violation: %v, want a stored *idemcore.Error", err)
	}
}
