package idem

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	bolterrors "go.etcd.io/bbolt/errors"

	"go.etcd.io/bbolt"
)

// putCorrupt stores bytes that are no record under key.
func putCorrupt(t *testing.T, e *Engine, key string) {
	t.Helper()
	require.NoError(t, e.b.write(func(tx *bbolt.Tx) error {
		slot := slotAt(e.c.Now(), e.b.st.width)
		e.b.st.addSlot(slot)
		b, err := rootBucket(tx).CreateBucketIfNotExists(slot.Name())
		if err != nil {
			return err
		}
		return b.Put([]byte(key), []byte("not a record"))
	}))
}

// interruptKey leaves an interrupted execution (a started record) on key.
func interruptKey(t *testing.T, e *Engine, key string) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	_, err := e.Do(ctx, key, nil, func(ctx context.Context) ([]byte, error) {
		cancel()
		return nil, ctx.Err()
	})
	require.ErrorIs(t, err, context.Canceled)
}

// TestErrorTextHasOnePrefix is issue 9's table: each sentinel, reached
// through Do, DoTx, Resolve, Open and the outbox, reads "idem: " once, at the
// start, and still matches its sentinel.
func TestErrorTextHasOnePrefix(t *testing.T) {
	dir := t.TempDir()
	open := func(t *testing.T, o *Options) *Engine {
		t.Helper()
		if o == nil {
			o = &Options{}
		}
		o.PruneInterval = -1
		e, err := Open(filepath.Join(t.TempDir(), "idem.db"), o)
		require.NoError(t, err)
		t.Cleanup(func() { _ = e.Close() })
		return e
	}
	ok := func(context.Context) ([]byte, error) { return []byte("ok"), nil }
	okTx := func(context.Context, *Tx) ([]byte, error) { return []byte("ok"), nil }
	closed := func(t *testing.T) *Engine {
		e := open(t, nil)
		require.NoError(t, e.Close())
		return e
	}
	// running holds key's call until the test ends.
	running := func(t *testing.T, e *Engine, key string) {
		entered, release := make(chan struct{}), make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = e.Do(context.Background(), key, nil, func(context.Context) ([]byte, error) {
				close(entered)
				<-release
				return nil, nil
			})
		}()
		<-entered
		t.Cleanup(func() { close(release); <-done })
	}
	long := strings.Repeat("k", 300)

	cases := []struct {
		name     string
		sentinel error
		run      func(t *testing.T) error
	}{
		{"Do/invalid key", ErrInvalidKey, func(t *testing.T) error {
			_, err := open(t, nil).Do(t.Context(), "", nil, ok)
			return err
		}},
		{"Do/fingerprint mismatch", ErrFingerprintMismatch, func(t *testing.T) error {
			e := open(t, nil)
			_, err := e.Do(t.Context(), "k", []byte("a"), ok)
			require.NoError(t, err)
			_, err = e.Do(t.Context(), "k", []byte("b"), ok)
			return err
		}},
		{"Do/in progress", ErrInProgress, func(t *testing.T) error {
			e := open(t, &Options{InFlight: InFlightFail})
			running(t, e, "k")
			_, err := e.Do(t.Context(), "k", nil, ok)
			return err
		}},
		{"Do/incomplete", ErrIncomplete, func(t *testing.T) error {
			e := open(t, &Options{Recovery: RecoverRefuse})
			interruptKey(t, e, "k")
			_, err := e.Do(t.Context(), "k", nil, ok)
			return err
		}},
		{"Do/retryable", ErrRetryable, func(t *testing.T) error {
			_, err := open(t, nil).Do(t.Context(), "k", nil, func(context.Context) ([]byte, error) {
				return nil, Retryable(errors.New("busy"))
			})
			return err
		}},
		{"Do/response too large", ErrResponseTooLarge, func(t *testing.T) error {
			_, err := open(t, &Options{MaxResponseSize: 1}).Do(t.Context(), "k", nil, ok)
			return err
		}},
		{"Do/corrupt", ErrCorrupt, func(t *testing.T) error {
			e := open(t, nil)
			putCorrupt(t, e, "k")
			_, err := e.Do(t.Context(), "k", nil, ok)
			return err
		}},
		{"Do/closed", ErrClosed, func(t *testing.T) error {
			_, err := closed(t).Do(t.Context(), "k", nil, ok)
			return err
		}},
		{"Do/re-entrant", ErrReentrant, func(t *testing.T) error {
			var inner error
			e := open(t, nil)
			_, err := e.Do(t.Context(), "k", nil, func(ctx context.Context) ([]byte, error) {
				_, inner = e.Do(context.Background(), "k", nil, ok)
				return nil, nil
			})
			require.NoError(t, err)
			return inner
		}},
		{"Do/long key", ErrInvalidKey, func(t *testing.T) error {
			_, err := open(t, nil).Do(t.Context(), long+"\x00", nil, ok)
			return err
		}},
		{"DoTx/invalid key", ErrInvalidKey, func(t *testing.T) error {
			_, err := open(t, nil).DoTx(t.Context(), " k", nil, okTx)
			return err
		}},
		{"DoTx/fingerprint mismatch", ErrFingerprintMismatch, func(t *testing.T) error {
			e := open(t, nil)
			_, err := e.DoTx(t.Context(), "k", []byte("a"), okTx)
			require.NoError(t, err)
			_, err = e.DoTx(t.Context(), "k", []byte("b"), okTx)
			return err
		}},
		{"DoTx/corrupt", ErrCorrupt, func(t *testing.T) error {
			e := open(t, nil)
			putCorrupt(t, e, "k")
			_, err := e.DoTx(t.Context(), "k", nil, okTx)
			return err
		}},
		{"DoTx/closed", ErrClosed, func(t *testing.T) error {
			_, err := closed(t).DoTx(t.Context(), "k", nil, okTx)
			return err
		}},
		{"DoTx/re-entrant", ErrReentrant, func(t *testing.T) error {
			e := open(t, nil)
			var inner error
			_, err := e.DoTx(t.Context(), "k", nil, func(ctx context.Context, tx *Tx) ([]byte, error) {
				_, inner = e.Do(ctx, "other", nil, ok)
				return nil, nil
			})
			require.NoError(t, err)
			return inner
		}},
		{"DoTx/reserved bucket", ErrReservedBucket, func(t *testing.T) error {
			var inner error
			_, err := open(t, nil).DoTx(t.Context(), "k", nil, func(ctx context.Context, tx *Tx) ([]byte, error) {
				_, inner = tx.Bucket([]byte(rootName))
				return nil, nil
			})
			require.NoError(t, err)
			return inner
		}},
		{"DoTx/invalid message", ErrInvalidMessage, func(t *testing.T) error {
			var inner error
			_, err := open(t, nil).DoTx(t.Context(), "k", nil, func(ctx context.Context, tx *Tx) ([]byte, error) {
				inner = tx.Enqueue("", nil)
				return nil, nil
			})
			require.NoError(t, err)
			return inner
		}},
		{"DoTx/Tx closed", ErrTxClosed, func(t *testing.T) error {
			var kept *Tx
			_, err := open(t, nil).DoTx(t.Context(), "k", nil, func(ctx context.Context, tx *Tx) ([]byte, error) {
				kept = tx
				return nil, nil
			})
			require.NoError(t, err)
			return kept.Enqueue("topic", nil)
		}},
		{"DoTx/fn's error from enqueue", ErrInvalidMessage, func(t *testing.T) error {
			_, err := open(t, nil).DoTx(t.Context(), "k", nil, func(ctx context.Context, tx *Tx) ([]byte, error) {
				return nil, tx.Enqueue("", nil)
			})
			return err
		}},
		{"Resolve/invalid key", ErrInvalidKey, func(t *testing.T) error {
			return open(t, nil).Resolve("", nil, nil)
		}},
		{"Resolve/not found", ErrNotFound, func(t *testing.T) error {
			return open(t, nil).Resolve("k", nil, nil)
		}},
		{"Resolve/state", ErrState, func(t *testing.T) error {
			e := open(t, nil)
			_, err := e.Do(t.Context(), "k", nil, ok)
			require.NoError(t, err)
			return e.Resolve("k", nil, nil)
		}},
		{"Resolve/in progress", ErrInProgress, func(t *testing.T) error {
			e := open(t, nil)
			running(t, e, "k")
			return e.Resolve("k", nil, nil)
		}},
		{"Resolve/corrupt", ErrCorrupt, func(t *testing.T) error {
			e := open(t, nil)
			putCorrupt(t, e, "k")
			return e.Resolve("k", nil, nil)
		}},
		{"Resolve/closed", ErrClosed, func(t *testing.T) error {
			return closed(t).Resolve("k", nil, nil)
		}},
		{"Get/corrupt", ErrCorrupt, func(t *testing.T) error {
			e := open(t, nil)
			putCorrupt(t, e, "k")
			_, err := e.Get("k")
			return err
		}},
		{"Records/corrupt", ErrCorrupt, func(t *testing.T) error {
			e := open(t, nil)
			putCorrupt(t, e, "k")
			var got error
			require.NoError(t, e.Records(func(r *Record, err error) error {
				got = err
				return nil
			}))
			return got
		}},
		{"Open/format", ErrFormat, func(t *testing.T) error {
			path := filepath.Join(dir, "empty.db")
			require.NoError(t, os.WriteFile(path, nil, 0o600))
			_, err := OpenFile(path, &BoltOptions{ReadOnly: true}, nil)
			return err
		}},
		{"Open/in use", bolterrors.ErrTimeout, func(t *testing.T) error {
			path := filepath.Join(t.TempDir(), "idem.db")
			e, err := Open(path, nil)
			require.NoError(t, err)
			defer e.Close()
			_, err = OpenFile(path, &BoltOptions{LockTimeout: 10 * time.Millisecond}, nil)
			return err
		}},
		{"RetryDead/not found", ErrMessageNotFound, func(t *testing.T) error {
			return open(t, nil).RetryDead(7)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.run(t)
			require.ErrorIs(t, err, c.sentinel)
			msg := err.Error()
			require.LessOrEqual(t, strings.Count(msg, "idem:"), 1, "%s", msg)
			var ie *Error
			if errors.As(err, &ie) && ie.Replayed == false && ie.Code == "idem_response_too_large" {
				return // fn's outcome, stored: its own text, no engine prefix
			}
			require.True(t, strings.HasPrefix(msg, "idem: "), "%s", msg)
			require.Equal(t, 1, strings.Count(msg, "idem:"), "%s", msg)
			var op *OpError
			require.ErrorAs(t, err, &op)
			if strings.HasPrefix(op.Key, long) {
				require.Len(t, op.Key, len(long)+1, "OpError.Key keeps the whole key")
				require.Contains(t, msg, `"`+long[:32]+`"…(301 bytes)`)
				require.NotContains(t, msg, long[:33])
			}
			if op.Path != "" {
				require.Equal(t, 1, strings.Count(msg, op.Path), "the path printed once: %s", msg)
			}
		})
	}
}
