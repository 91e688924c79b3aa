package idem_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/idemkit/idem"
)

// TestDamagedPagesNeverPanic damages one page at a time of a file that holds
// records, outbox messages and dead letters (the meta pages apart: Open
// checks those), opens it, and drives every call that reads the file: Do,
// DoTx, Get, Forget, Resolve, Records, Messages, Prune, ScanFile, Backup.
// bbolt asserts on a page that is not what its parent says (it panics);
// none of that may reach the caller as a panic, and an error about the
// damage wraps ErrCorrupt. Before the fix, most damaged pages made Do panic
// in the caller's goroutine.
func TestDamagedPagesNeverPanic(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.db")
	e, err := idem.Open(good, &idem.Options{PruneInterval: -1})
	require.NoError(t, err)
	ctx := context.Background()
	for i := range 1500 {
		_, err := e.Do(ctx, fmt.Sprint("k", i), nil, func(context.Context) ([]byte, error) { return bytes.Repeat([]byte{'v'}, 100), nil })
		require.NoError(t, err)
	}
	for i := range 200 {
		_, err := e.DoTx(ctx, fmt.Sprint("t", i), nil, func(_ context.Context, tx *idem.Tx) ([]byte, error) {
			return nil, tx.Enqueue("mail", bytes.Repeat([]byte{'m'}, 50))
		})
		require.NoError(t, err)
	}
	require.NoError(t, e.Close())
	orig, err := os.ReadFile(good)
	require.NoError(t, err)
	const pageSize = 4096
	pages := len(orig) / pageSize
	require.Greater(t, pages, 20)

	rng := rand.New(rand.NewPCG(1, 2))
	opened, damagedSeen := 0, 0
	for p := 2; p < pages; p++ {
		bad := bytes.Clone(orig)
		for i := p * pageSize; i < (p+1)*pageSize; i++ {
			bad[i] = byte(rng.Uint32())
		}
		path := filepath.Join(dir, fmt.Sprintf("p%d.db", p))
		require.NoError(t, os.WriteFile(path, bad, 0o600))
		errs := exercise(t, path)
		if errs.opened {
			opened++
		}
		if errs.corrupt {
			damagedSeen++
		}
		for _, err := range errs.other {
			t.Errorf("page %d: an error that does not wrap ErrCorrupt: %v", p, err)
		}
	}
	t.Logf("%d pages damaged one at a time: %d files opened, %d reported the damage (ErrCorrupt)", pages-2, opened, damagedSeen)
	require.Positive(t, damagedSeen)
}

type exerciseResult struct {
	opened, corrupt bool
	other           []error
}

// exercise opens path and runs every reading call on it, recovering a
// panic only to fail the test with it.
func exercise(t *testing.T, path string) (res exerciseResult) {
	t.Helper()
	check := func(op string, err error) {
		switch {
		case err == nil, errors.Is(err, idem.ErrNotFound), errors.Is(err, idem.ErrState):
		case errors.Is(err, idem.ErrCorrupt):
			res.corrupt = true
		case errors.Is(err, idem.ErrStorageFailed):
			// a commit that failed on the damage: fails closed
			res.corrupt = true
		default:
			res.other = append(res.other, fmt.Errorf("%s: %w", op, err))
		}
	}
	run := func(op string, fn func() error) {
		defer func() {
			if v := recover(); v != nil {
				t.Errorf("%s on %s panicked: %v", op, filepath.Base(path), v)
			}
		}()
		check(op, fn())
	}
	var e *idem.Engine
	run("open", func() (err error) {
		// The dispatcher runs too: it reads the outbox on its own
		// goroutine, where a panic would end the process.
		e, err = idem.Open(path, &idem.Options{PruneInterval: -1, Outbox: idem.OutboxOptions{
			Dispatch: true,
			Handlers: map[string]idem.Handler{"mail": func(context.Context, idem.Message) error { return nil }},
		}})
		return err
	})
	if e == nil {
		return res
	}
	res.opened = true
	defer run("close", e.Close)
	ctx := context.Background()
	for i := 0; i < 1500; i += 150 {
		run("do", func() error {
			_, err := e.Do(ctx, fmt.Sprint("k", i), nil, func(context.Context) ([]byte, error) { return []byte("new"), nil })
			return err
		})
		run("dotx", func() error {
			_, err := e.DoTx(ctx, fmt.Sprint("k", i+1), nil, func(_ context.Context, tx *idem.Tx) ([]byte, error) {
				return nil, tx.Enqueue("mail", []byte("m"))
			})
			return err
		})
		run("get", func() error { _, err := e.Get(fmt.Sprint("k", i+2)); return err })
	}
	run("forget", func() error { return e.Forget("k7") })
	run("resolve", func() error { return e.Resolve("k8", nil, nil) })
	run("records", func() error {
		return e.Records(func(_ *idem.Record, err error) error { check("records item", err); return nil })
	})
	run("messages", func() error {
		return e.Messages(func(_ *idem.Message, err error) error { check("messages item", err); return nil })
	})
	run("prune", func() error { _, err := e.Prune(ctx); return err })
	run("scanfile", func() error { _, err := e.ScanFile(); return err })
	run("backup", func() error { _, err := e.Backup(io.Discard); return err })
	return res
}

// TestCallbackPanicsAreTheCallers: a panic in a callback of Records,
// Messages or View is the caller's own, raised again with its value: only
// bbolt's panics on a damaged page become ErrCorrupt.
func TestCallbackPanicsAreTheCallers(t *testing.T) {
	e, err := idem.Open(filepath.Join(t.TempDir(), "idem.db"), &idem.Options{PruneInterval: -1})
	require.NoError(t, err)
	defer e.Close()
	_, err = e.DoTx(context.Background(), "k", nil, func(_ context.Context, tx *idem.Tx) ([]byte, error) {
		return []byte("v"), tx.Enqueue("mail", []byte("m"))
	})
	require.NoError(t, err)
	require.PanicsWithValue(t, "mine", func() {
		_ = e.Records(func(*idem.Record, error) error { panic("mine") })
	})
	require.PanicsWithValue(t, "mine", func() {
		_ = e.Messages(func(*idem.Message, error) error { panic("mine") })
	})
	require.PanicsWithValue(t, "mine", func() {
		_ = e.View(func(*bbolt.Tx) error { panic("mine") })
	})
	_, err = e.Get("k")
	require.NoError(t, err, "the engine goes on")
}
