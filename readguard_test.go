package idem_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit/boltkit"
)

// A Records, View or Messages callback runs inside a bbolt read transaction.
// A write from there waits forever as soon as the file must grow (bbolt's
// remap waits for every read transaction to end, this one included), and
// with it every call of the program; a read from there waits too while
// another goroutine's write remaps. It worked in small tests and hung in
// production. Every engine call from such a callback now fails at once with
// ErrReentrant, as from inside a DoTx fn.

func TestEngineCallsFromReadCallbacksAreReentrant(t *testing.T) {
	e, _ := boltkit.OpenFile(t, &idem.BoltOptions{NoSync: true}, nil)
	_, err := e.Do(bg, "a", nil, okFn("1"))
	require.NoError(t, err)
	_, err = e.DoTx(bg, "m", nil, func(_ context.Context, tx *idem.Tx) ([]byte, error) {
		return nil, tx.Enqueue("mail", []byte("x"))
	})
	require.NoError(t, err)

	calls := map[string]func() error{
		"Do": func() error {
			_, err := e.Do(bg, "new", nil, okFn("v"))
			return err
		},
		"Do replay": func() error {
			_, err := e.Do(bg, "a", nil, okFn("v"))
			return err
		},
		"DoTx": func() error {
			_, err := e.DoTx(bg, "newtx", nil, func(context.Context, *idem.Tx) ([]byte, error) { return nil, nil })
			return err
		},
		"Forget":  func() error { return e.Forget("a") },
		"Resolve": func() error { return e.Resolve("a", nil, nil) },
		"Get": func() error {
			_, err := e.Get("a")
			return err
		},
		"Prune": func() error {
			_, err := e.Prune(bg)
			return err
		},
		"View": func() error { return e.View(func(*bbolt.Tx) error { return nil }) },
		"ScanFile": func() error {
			_, err := e.ScanFile()
			return err
		},
		"RetryDead": func() error { return e.RetryDead(1) },
	}
	callbacks := map[string]func(inside func()) error{
		"Records": func(inside func()) error {
			return e.Records(func(*idem.Record, error) error { inside(); return nil })
		},
		"View": func(inside func()) error {
			return e.View(func(*bbolt.Tx) error { inside(); return nil })
		},
		"Messages": func(inside func()) error {
			return e.Messages(func(*idem.Message, error) error { inside(); return nil })
		},
	}
	for cbName, cb := range callbacks {
		for callName, call := range calls {
			t.Run(cbName+"/"+callName, func(t *testing.T) {
				var got error
				once := sync.Once{}
				require.NoError(t, cb(func() { once.Do(func() { got = call() }) }))
				require.ErrorIs(t, got, idem.ErrReentrant)
			})
		}
	}

	// Nothing changed, and outside the callbacks everything works again.
	res, err := e.Do(bg, "a", nil, mustNotRun(t))
	require.NoError(t, err)
	require.True(t, res.Replayed)
	_, err = e.Get("new")
	require.ErrorIs(t, err, idem.ErrNotFound)
	require.NoError(t, e.Records(func(r *idem.Record, err error) error {
		// A nested callback on another goroutine is not inside this one.
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); _, err = e.ScanFile() }()
		wg.Wait()
		return err
	}))
}
