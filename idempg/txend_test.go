package idempg_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idempg"
	"github.com/idemkit/idem/idempg/internal/pgtest"
)

// TestDoTxFnEndingItsTransaction: tx.Commit and tx.Rollback in a DoTx fn
// fail with ErrTxEnded and leave the transaction whole (the call commits
// as usual). A fn that ends the transaction with SQL (COMMIT, ROLLBACK,
// END, COMMIT AND CHAIN) fails the call with ErrTxEnded, and no done
// outcome is stored for it: the engine cannot vouch for writes that
// committed (or rolled back) outside its transaction.
func TestDoTxFnEndingItsTransaction(t *testing.T) {
	st := newStore(t, pgtest.Env)
	e := st.open(t, nil)
	ctx := context.Background()
	if _, err := st.pool.Exec(ctx, "CREATE TABLE "+st.opts.Schema+".effects (key text PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	refused := map[string]bool{"tx.Commit": true, "tx.Rollback": true}
	for name, end := range map[string]func(ctx context.Context, tx pgx.Tx) error{
		"tx.Commit":        func(ctx context.Context, tx pgx.Tx) error { return tx.Commit(ctx) },
		"tx.Rollback":      func(ctx context.Context, tx pgx.Tx) error { return tx.Rollback(ctx) },
		"COMMIT":           func(ctx context.Context, tx pgx.Tx) error { _, err := tx.Exec(ctx, "COMMIT"); return err },
		"ROLLBACK":         func(ctx context.Context, tx pgx.Tx) error { _, err := tx.Exec(ctx, "ROLLBACK"); return err },
		"COMMIT AND CHAIN": func(ctx context.Context, tx pgx.Tx) error { _, err := tx.Exec(ctx, "COMMIT AND CHAIN"); return err },
		"END":              func(ctx context.Context, tx pgx.Tx) error { _, err := tx.Exec(ctx, "END"); return err },
	} {
		t.Run(name, func(t *testing.T) {
			key := "k-" + name
			_, err := e.DoTx(ctx, key, nil, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
				if _, err := tx.Exec(ctx, "INSERT INTO "+st.opts.Schema+".effects VALUES ($1)", key); err != nil {
					return nil, err
				}
				endErr := end(ctx, tx) // fn ignores the error, as a careless one would
				if refused[name] && !errors.Is(endErr, idempg.ErrTxEnded) {
					t.Errorf("%s: %v, want ErrTxEnded", name, endErr)
				}
				return []byte("charged"), nil
			})
			if refused[name] {
				if err != nil {
					t.Fatalf("DoTx after a refused %s: %v", name, err)
				}
				if r, err := e.Get(key); err != nil || r.State != idemcore.StateDone {
					t.Fatalf("record after a refused %s: %+v, %v", name, r, err)
				}
				return
			}
			if !errors.Is(err, idempg.ErrTxEnded) {
				t.Fatalf("DoTx: %v, want ErrTxEnded", err)
			}
			if r, err := e.Get(key); err == nil && r.State == idemcore.StateDone {
				t.Fatalf("an outcome was stored for a transaction fn ended: %+v", r)
			}
		})
	}
	// The engine keeps working on the same pool.
	if _, err := e.DoTx(ctx, "after", nil, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		_, err := tx.Exec(ctx, "INSERT INTO "+st.opts.Schema+".effects VALUES ('after')")
		return nil, err
	}); err != nil {
		t.Fatal(err)
	}
}
