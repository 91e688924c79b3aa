package idempg_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idempg"
	"github.com/idemkit/idem/idempg/internal/pgtest"
)

// namedPool is a pool on env whose connections carry a unique
// application_name, so that a test can end them from another pool.
func namedPool(t *testing.T, env string) (*pgxpool.Pool, string) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.DSN(t, env))
	if err != nil {
		t.Fatal(err)
	}
	var r [6]byte
	_, _ = rand.Read(r[:])
	name := "idemtest_" + hex.EncodeToString(r[:])
	cfg.ConnConfig.RuntimeParams["application_name"] = name
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, name
}

// terminate ends every server session of the pool named name (as a server
// restart or an idle-session reaper does): its pooled connections are dead.
func terminate(t *testing.T, st *store, name string) {
	t.Helper()
	if _, err := st.pool.Exec(context.Background(), "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1", name); err != nil {
		t.Fatal(err)
	}
}

// TestWritesRetriedOnFreshConnection: when the pooled connections die while
// fn runs (the server ended their sessions), the done write, and a
// Retryable fn's release, fail on a dead connection while the lease is
// alive: they are retried on a fresh one, so the caller gets its outcome
// (not a driver error) and a retry replays it, or finds the key free.
func TestWritesRetriedOnFreshConnection(t *testing.T) {
	st := newStore(t, pgtest.Env)
	pool, name := namedPool(t, pgtest.Env)
	o := idempg.Options{Schema: st.opts.Schema, Lease: 5 * time.Second, PollInterval: 20 * time.Millisecond}
	e, err := idempg.Open(context.Background(), pool, &o, &idemcore.Options{PruneInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	ctx := context.Background()

	res, err := e.Do(ctx, "done", []byte("fp"), func(context.Context) ([]byte, error) {
		terminate(t, st, name)
		return []byte("A"), nil
	})
	if err != nil || string(res.Response) != "A" {
		t.Fatalf("Do whose connections died while fn ran: %+v, %v; want A's answer", res, err)
	}
	runs := 0
	res, err = e.Do(ctx, "done", []byte("fp"), func(context.Context) ([]byte, error) { runs++; return []byte("again"), nil })
	if err != nil || string(res.Response) != "A" || !res.Replayed || runs != 0 {
		t.Fatalf("the retry: %+v, %v, fn ran %d times; want A's answer replayed", res, err, runs)
	}

	_, err = e.Do(ctx, "retryable", []byte("fp"), func(context.Context) ([]byte, error) {
		terminate(t, st, name)
		return nil, idemcore.Retryable(errTemporary)
	})
	if !errors.Is(err, idemcore.ErrRetryable) || !errors.Is(err, errTemporary) {
		t.Fatalf("a Retryable fn whose connections died: %v, want its Retryable error alone", err)
	}
	res, err = e.Do(ctx, "retryable", []byte("fp"), func(context.Context) ([]byte, error) { return []byte("B"), nil })
	if err != nil || string(res.Response) != "B" || res.Replayed || res.Attempt != 1 {
		t.Fatalf("after the released key: %+v, %v; want a first execution", res, err)
	}
}

var errTemporary = temporary("downstream busy")

type temporary string

func (e temporary) Error() string { return string(e) }
