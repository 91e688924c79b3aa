package idem_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit"
)

// v3Replays checks what testdata/file-v3.db holds (testdata/README.md), in
// whatever engine opened it: every key replayed without running fn, the
// stored error, the interrupted execution, the DoTx's buckets and its
// outbox message. done is the done records the file must hold at least.
func v3Replays(t *testing.T, e *idem.Engine, done int) {
	t.Helper()
	for key, want := range map[string]string{"order-1": `{"order":"o-1"}`, "empty": "", "tx-1": "tx-ok"} {
		fp := map[string]string{"order-1": "args-1", "empty": "args-e", "tx-1": "args-t"}[key]
		res, err := e.Do(bg, key, []byte(fp), mustNotRun(t))
		require.NoError(t, err, key)
		require.True(t, res.Replayed, key)
		require.Equal(t, want, string(res.Response), key)
		require.NotNil(t, res.Response, "%s: an empty response stays empty, not nil", key)
	}
	res, err := e.Do(bg, "nil-resp", []byte("args-n"), mustNotRun(t))
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.Nil(t, res.Response, "no response stays nil")
	_, err = e.Do(bg, "order-2", []byte("args-2"), mustNotRun(t))
	var ie *idem.Error
	require.True(t, errors.As(err, &ie), "its stored error replayed: %v", err)
	// Its fn returned an *idem.Error: stored as the error's text, no code
	// (as in testdata/file-v2.db).
	require.Equal(t, "card_declined: card declined", ie.Message)
	_, err = e.Do(bg, "order-1", []byte("other args"), mustNotRun(t))
	require.ErrorIs(t, err, idem.ErrFingerprintMismatch)
	r, err := e.Get("order-1")
	require.NoError(t, err)
	require.Equal(t, 7*day, r.Retention)
	r, err = e.Get("order-3")
	require.NoError(t, err)
	require.Equal(t, idem.StateStarted, r.State, "the fn that panicked left an interrupted execution")
	require.Equal(t, 7*day, r.Retention)
	st, err := e.ScanFile()
	require.NoError(t, err)
	require.Equal(t, 1, st.Started)
	require.GreaterOrEqual(t, st.Done, done)
	require.Equal(t, 1, st.Outbox.Pending)
	require.NoError(t, e.View(func(tx *bbolt.Tx) error {
		orders := tx.Bucket([]byte("orders"))
		require.NotNil(t, orders)
		require.Equal(t, "paid", string(orders.Get([]byte("o-tx"))))
		items := orders.Bucket([]byte("items"))
		require.NotNil(t, items, "the nested bucket")
		require.Equal(t, "1", string(items.Get([]byte("i-1"))))
		require.Equal(t, uint64(7), items.Sequence())
		return nil
	}))
}

// v3Delivers delivers the fixture's outbox message (topic email, from tx-1)
// through a handler and Dispatch, then recovers order-3's interrupted
// execution.
func v3Delivers(t *testing.T, e *idem.Engine) {
	t.Helper()
	got := make(chan idem.Message, 1)
	e.Handle("email", func(_ context.Context, m idem.Message) error { got <- m; return nil })
	ctx, cancel := context.WithCancel(bg)
	done := make(chan error, 1)
	go func() { done <- e.Dispatch(ctx) }()
	m := <-got
	cancel()
	<-done
	require.Equal(t, "tx-1", m.Key)
	require.Equal(t, "email", m.Topic)
	require.Equal(t, "receipt o-tx", string(m.Payload))

	var call idem.Call
	res, err := e.Do(bg, "order-3", []byte("args-3"), func(ctx context.Context) ([]byte, error) {
		call, _ = idem.CallFrom(ctx)
		return []byte("reconciled"), nil
	})
	require.NoError(t, err)
	require.True(t, call.Recovered, "order-3 recovers the interrupted execution")
	require.Equal(t, 2, res.Attempt)
}

// testdata/file-v3.db was written by the last build of format version 3
// (testdata/README.md says what it holds) and closed cleanly: its journal
// checkpointed into the file, none left beside it. Every later build must
// open it, read-only and for writing, replay it, and deliver its message.
func TestOpenFormatVersion3File(t *testing.T) {
	path := copyFixture(t, "testdata/file-v3.db")
	clock := testkit.NewClock(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC).Add(3 * day))
	replays := func(t *testing.T, e *idem.Engine) { v3Replays(t, e, 5) }
	readOnlyChangesNothing(t, path, clock.Now, replays)
	t.Run("writable", func(t *testing.T) {
		e := v3Upgrade(t, path, clock, replays, false)
		res, err := e.Do(bg, "order-3", []byte("args-3"), mustNotRun(t))
		require.NoError(t, err)
		require.True(t, res.Replayed)
		require.Equal(t, "reconciled", string(res.Response))
		res, err = e.Do(bg, "tx-1", []byte("args-t"), mustNotRun(t))
		require.NoError(t, err)
		require.Equal(t, "tx-ok", string(res.Response))
	})
}

// copyJournalFixture copies the file at fixture (testdata/) and its journal
// directory (fixture + ".journal") into the test's directory and returns the
// copy's path.
func copyJournalFixture(t *testing.T, fixture string) string {
	t.Helper()
	path := copyFixture(t, fixture)
	segs, err := os.ReadDir(fixture + ".journal")
	require.NoError(t, err)
	require.NotEmpty(t, segs)
	require.NoError(t, os.Mkdir(path+".journal", 0o700))
	for _, s := range segs {
		b, err := os.ReadFile(filepath.Join(fixture+".journal", s.Name()))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(path+".journal", s.Name()), b, 0o600))
	}
	return path
}

// testdata/file-v3-journal.db was written by the last build of format
// version 3 as testdata/file-v3.db, reopened, given j-1 and j-2, and left
// without Close before its checkpoint ran: those two are only in the
// frames of its journal (file-v3-journal.db.journal/). Every later build must
// replay the journal on open, read-only and for writing.
func TestOpenFormatVersion3FileWithJournal(t *testing.T) {
	path := copyJournalFixture(t, "testdata/file-v3-journal.db")
	clock := testkit.NewClock(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC).Add(3 * day))
	replays := func(t *testing.T, e *idem.Engine) {
		t.Helper()
		v3Replays(t, e, 7)
		for key, want := range map[string]string{"j-1": "journaled 1", "j-2": "journaled 2"} {
			fp := map[string]string{"j-1": "args-j1", "j-2": "args-j2"}[key]
			res, err := e.Do(bg, key, []byte(fp), mustNotRun(t))
			require.NoError(t, err, key)
			require.True(t, res.Replayed, key)
			require.Equal(t, want, string(res.Response), key)
			r, err := e.Get(key)
			require.NoError(t, err, key)
			require.Equal(t, idem.StateDone, r.State, key)
		}
	}
	segment := filepath.Join(path+".journal", "00000001")
	before, err := os.ReadFile(segment)
	require.NoError(t, err)
	readOnlyChangesNothing(t, path, clock.Now, replays)
	after, err := os.ReadFile(segment)
	require.NoError(t, err)
	require.Equal(t, before, after, "a read-only Open leaves the journal as it was")

	t.Run("writable", func(t *testing.T) {
		e := v3Upgrade(t, path, clock, replays, true)
		for key, want := range map[string]string{"j-1": "journaled 1", "j-2": "journaled 2", "order-3": "reconciled"} {
			fp := map[string]string{"j-1": "args-j1", "j-2": "args-j2", "order-3": "args-3"}[key]
			res, err := e.Do(bg, key, []byte(fp), mustNotRun(t))
			require.NoError(t, err, key)
			require.True(t, res.Replayed, key)
			require.Equal(t, want, string(res.Response), key)
		}
	})
}

// v3Upgrade opens the version 3 file at path for writing (journaled: its
// open must replay the journal's frames), checks it with replays, delivers
// its message, closes it, and opens it again: the engine it returns (closed
// with the test) works on the file as this build wrote it.
func v3Upgrade(t *testing.T, path string, clock *testkit.Clock, replays func(*testing.T, *idem.Engine), journaled bool) *idem.Engine {
	t.Helper()
	e, err := idem.Open(path, &idem.Options{Now: clock.Now, PruneInterval: -1})
	require.NoError(t, err)
	if journaled {
		require.NotZero(t, e.Stats().Replayed, "the open replayed the journal's frames")
	}
	replays(t, e)
	v3Delivers(t, e)
	require.NoError(t, e.Close())
	require.GreaterOrEqual(t, formatVersion(t, path), uint32(3))

	e, err = idem.Open(path, &idem.Options{Now: clock.Now, PruneInterval: -1})
	require.NoError(t, err)
	t.Cleanup(func() { e.Close() })
	return e
}
