package idem_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit"
	"github.com/idemkit/idem/internal/testkit/boltkit"
)

var day = 24 * time.Hour

// interruptByPanic leaves key with an interrupted execution: fn panics.
func interruptByPanic(t *testing.T, e *idem.Engine, key string) {
	t.Helper()
	defer func() { require.NotNil(t, recover(), "fn's panic reaches the caller") }()
	_, _ = e.Do(bg, key, []byte("args of "+key), func(context.Context) ([]byte, error) { panic("crash in the middle") })
}

// reopen closes e and opens its file again with opts.
func reopen(t *testing.T, e *idem.Engine, path string, opts *idem.Options) *idem.Engine {
	t.Helper()
	require.NoError(t, e.Close())
	e, err := idem.Open(path, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// A record lives at least the retention window in force when it was written,
// whatever window a later Open passes: reopening with a shorter window must
// not expire or prune it early.
func TestRecordKeepsTheRetentionItWasWrittenUnder(t *testing.T) {
	clock := testkit.NewClock(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	e, path := boltkit.Open(t, &idem.Options{Now: clock.Now, PruneInterval: -1, Retention: 7 * day})
	_, err := e.Do(bg, "k", []byte("a"), okFn("first"))
	require.NoError(t, err)
	r := record(t, e, "k")
	require.Equal(t, 7*day, r.Retention, "the window is recorded with the record")

	e = reopen(t, e, path, &idem.Options{Now: clock.Now, PruneInterval: -1, Retention: time.Hour})
	clock.Advance(3 * day)
	n, err := e.Prune(bg)
	require.NoError(t, err)
	require.Zero(t, n, "nothing of the 7-day window has expired")
	res, err := e.Do(bg, "k", []byte("a"), mustNotRun(t))
	require.NoError(t, err)
	require.True(t, res.Replayed, "replayed 3 days on, under a 1-hour Open")
	st, err := e.ScanFile()
	require.NoError(t, err)
	require.Equal(t, 1, st.Done)
	require.Zero(t, st.ExpiredPending)

	clock.Advance(4 * day) // 7 days after it completed
	_, err = e.Get("k")
	require.ErrorIs(t, err, idem.ErrNotFound, "expired at the end of its own window")
	clock.Advance(7 * day) // its slot is as wide as its window
	n, err = e.Prune(bg)
	require.NoError(t, err)
	require.Equal(t, 1, n)

	// A record written under the shorter window expires by its own.
	_, err = e.Do(bg, "short", nil, okFn("v"))
	require.NoError(t, err)
	require.Equal(t, time.Hour, record(t, e, "short").Retention)
	clock.Advance(time.Hour)
	_, err = e.Get("short")
	require.ErrorIs(t, err, idem.ErrNotFound)
}

// A record written under a shorter window lives the longer window of a later
// Open too: retention is a floor, and a later, longer one only lengthens it.
func TestLongerRetentionLengthensOlderRecords(t *testing.T) {
	clock := testkit.NewClock(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	e, path := boltkit.Open(t, &idem.Options{Now: clock.Now, PruneInterval: -1, Retention: time.Hour})
	_, err := e.Do(bg, "k", nil, okFn("v"))
	require.NoError(t, err)
	e = reopen(t, e, path, &idem.Options{Now: clock.Now, PruneInterval: -1, Retention: day})
	clock.Advance(2 * time.Hour)
	n, err := e.Prune(bg)
	require.NoError(t, err)
	require.Zero(t, n)
	res, err := e.Do(bg, "k", nil, mustNotRun(t))
	require.NoError(t, err)
	require.True(t, res.Replayed)
}

// An interrupted execution written under RecoverRefuse is kept until it is
// resolved, whatever a later Open passes: a re-executing Open, a short window,
// a prune a month later. The next call recovers it.
func TestInterruptedRecordUnderRefuseIsKeptUntilResolved(t *testing.T) {
	clock := testkit.NewClock(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	e, path := boltkit.Open(t, &idem.Options{Now: clock.Now, PruneInterval: -1, Recovery: idem.RecoverRefuse})
	interruptByPanic(t, e, "k")
	_, err := e.Do(bg, "done", nil, okFn("v"))
	require.NoError(t, err)
	r := record(t, e, "k")
	require.True(t, r.KeptUntilResolved)
	require.Equal(t, idem.StateStarted, r.State, "kept until resolved: it never expires")

	e = reopen(t, e, path, &idem.Options{Now: clock.Now, PruneInterval: -1, Retention: time.Hour})
	clock.Advance(30 * day)
	n, err := e.Prune(bg)
	require.NoError(t, err)
	require.Equal(t, 1, n, "the done record beside it goes, the interrupted one stays")
	st, err := e.ScanFile()
	require.NoError(t, err)
	require.Equal(t, 1, st.Started)

	var call idem.Call
	res, err := e.Do(bg, "k", []byte("args of k"), func(ctx context.Context) ([]byte, error) {
		call, _ = idem.CallFrom(ctx)
		return []byte("reconciled"), nil
	})
	require.NoError(t, err)
	require.True(t, call.Recovered, "the evidence of the unknown outcome was kept")
	require.Equal(t, 2, res.Attempt)
}

// A recovering attempt that is interrupted again keeps the evidence of the
// first: its own started record is kept until resolved too, and keeps the
// longer window.
func TestInterruptedRecoveryInheritsTheEvidence(t *testing.T) {
	clock := testkit.NewClock(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	e, path := boltkit.Open(t, &idem.Options{Now: clock.Now, PruneInterval: -1, Recovery: idem.RecoverRefuse, Retention: 7 * day})
	interruptByPanic(t, e, "k")
	e = reopen(t, e, path, &idem.Options{Now: clock.Now, PruneInterval: -1, Retention: time.Hour})
	interruptByPanic(t, e, "k") // attempt 2, re-executing, crashes again
	r := record(t, e, "k")
	require.Equal(t, 2, r.Attempt)
	require.True(t, r.KeptUntilResolved)
	require.Equal(t, 7*day, r.Retention)
	clock.Advance(30 * day)
	_, err := e.Prune(bg)
	require.NoError(t, err)
	require.Equal(t, 2, record(t, e, "k").Attempt)
}

// Crash evidence that does expire (RecoverReexecute) is not dropped silently:
// the pruner logs at warn level how many interrupted executions a dropped slot
// held, and never their keys.
func TestPruneWarnsWhenItDropsInterruptedExecutions(t *testing.T) {
	clock := testkit.NewClock(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	var mu sync.Mutex
	var logged bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logged.Write(p)
	}), &slog.HandlerOptions{Level: slog.LevelDebug}))
	e, _ := boltkit.Open(t, &idem.Options{Now: clock.Now, PruneInterval: -1, Logger: logger})
	interruptByPanic(t, e, "secret-key-1")
	interruptByPanic(t, e, "secret-key-2")
	_, err := e.Do(bg, "secret-key-3", nil, okFn("v"))
	require.NoError(t, err)
	clock.Advance(2 * idem.DefaultRetention)
	n, err := e.Prune(bg)
	require.NoError(t, err)
	require.Equal(t, 3, n)

	mu.Lock()
	out := logged.String()
	mu.Unlock()
	var warn map[string]any
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), line)
		if m["level"] == "WARN" {
			warn = m
		}
	}
	require.NotNil(t, warn, "a warning: %s", out)
	require.EqualValues(t, 2, warn["interrupted"], "the count of interrupted executions dropped: %s", out)
	require.NotContains(t, out, "secret-key", "keys are never logged")

	// Only done records dropped: no warning.
	logged.Reset()
	_, err = e.Do(bg, "k", nil, okFn("v"))
	require.NoError(t, err)
	clock.Advance(2 * idem.DefaultRetention)
	_, err = e.Prune(bg)
	require.NoError(t, err)
	require.NotContains(t, logged.String(), "WARN")
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// testdata/file-v1.db was written by the last build of format version 1
// (testdata/README.md says what it holds). Every later build must open it,
// read-only and for writing, and replay it: its records keep the window they
// were written under (7 days: the slot width says so), its interrupted
// execution is kept until resolved (version 1 did not record the policy, so
// the engine keeps it), and its outbox message and DoTx data are intact.
func TestOpenFormatVersion1File(t *testing.T) {
	path := copyFixture(t, "testdata/file-v1.db")
	written := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	clock := testkit.NewClock(written.Add(3 * day))
	replays := func(t *testing.T, e *idem.Engine) {
		t.Helper()
		for key, want := range map[string]string{"order-1": `{"order":"o-1"}`, "empty": "", "tx-1": "tx-ok"} {
			fp := map[string]string{"order-1": "args-1", "empty": "args-e", "tx-1": "args-t"}[key]
			res, err := e.Do(bg, key, []byte(fp), mustNotRun(t))
			require.NoError(t, err, key)
			require.True(t, res.Replayed)
			require.Equal(t, want, string(res.Response), key)
			require.NotNil(t, res.Response, "%s: an empty response stays empty, not nil", key)
		}
		res, err := e.Do(bg, "nil-resp", []byte("args-n"), mustNotRun(t))
		require.NoError(t, err)
		require.Nil(t, res.Response, "no response stays nil")
		_, err = e.Do(bg, "order-2", []byte("args-2"), mustNotRun(t))
		var ie *idem.Error
		require.True(t, errors.As(err, &ie), "%v", err)
		require.Equal(t, "card_declined", ie.Code)
		require.Equal(t, "card declined", ie.Message)
		_, err = e.Do(bg, "order-1", []byte("other args"), mustNotRun(t))
		require.ErrorIs(t, err, idem.ErrFingerprintMismatch)
		r, err := e.Get("order-1")
		require.NoError(t, err)
		require.Equal(t, 7*day, r.Retention, "version 1 recorded the window as the slot's width")
		r, err = e.Get("order-3")
		require.NoError(t, err)
		require.Equal(t, idem.StateStarted, r.State)
		require.True(t, r.KeptUntilResolved, "the policy it was written under is unknown: kept")
		st, err := e.ScanFile()
		require.NoError(t, err)
		require.Equal(t, 1, st.Started)
		require.Equal(t, 5, st.Done)
		require.Equal(t, 1, st.Outbox.Pending)
		require.NoError(t, e.View(func(tx *bbolt.Tx) error {
			require.Equal(t, "paid", string(tx.Bucket([]byte("orders")).Get([]byte("o-tx"))))
			return nil
		}))
	}

	readOnlyChangesNothing(t, path, clock.Now, replays)

	t.Run("migrated", func(t *testing.T) {
		e, err := idem.Open(path, &idem.Options{Now: clock.Now, PruneInterval: -1})
		require.NoError(t, err)
		replays(t, e)
		require.NoError(t, e.Close())
		require.Equal(t, uint32(4), formatVersion(t, path), "Open migrated the file to the current format version (4)")

		e, err = idem.Open(path, &idem.Options{Now: clock.Now, PruneInterval: -1})
		require.NoError(t, err)
		defer e.Close()
		replays(t, e)

		clock.Advance(5 * day) // 8 days after: the 7-day window is over
		_, err = e.Get("order-1")
		require.ErrorIs(t, err, idem.ErrNotFound)
		clock.Advance(30 * day)
		n, err := e.Prune(bg)
		require.NoError(t, err)
		require.Equal(t, 5, n, "the done records go; the interrupted execution stays")
		var call idem.Call
		res, err := e.Do(bg, "order-3", []byte("args-3"), func(ctx context.Context) ([]byte, error) {
			call, _ = idem.CallFrom(ctx)
			return []byte("reconciled"), nil
		})
		require.NoError(t, err)
		require.True(t, call.Recovered)
		require.Equal(t, 2, res.Attempt)
	})
}

// formatVersion reads the format version in the file's meta bucket.
func formatVersion(t *testing.T, path string) uint32 {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true})
	require.NoError(t, err)
	defer db.Close()
	var v uint32
	require.NoError(t, db.View(func(tx *bbolt.Tx) error {
		v = binary.BigEndian.Uint32(tx.Bucket([]byte("idem")).Bucket([]byte("meta")).Get([]byte("version")))
		return nil
	}))
	return v
}

// A dead letter lives at least the dead-letter retention in force when it
// died, whatever a later Open passes: the same rule as for records.
func TestDeadLetterKeepsTheRetentionItDiedUnder(t *testing.T) {
	clock := testkit.NewClock(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	fail := map[string]idem.Handler{"t": func(context.Context, idem.Message) error { return errors.New("no") }}
	e, path := boltkit.OpenFile(t, &idem.BoltOptions{NoSync: true}, &idem.Options{Now: clock.Now, PruneInterval: -1,
		Outbox: idem.OutboxOptions{Dispatch: true, PollInterval: time.Millisecond, MaxAttempts: 1, DeadLetterRetention: 30 * day, Handlers: fail}})
	_, err := e.DoTx(bg, "a", nil, func(_ context.Context, tx *idem.Tx) ([]byte, error) { return nil, tx.Enqueue("t", []byte("1")) })
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		st, err := e.ScanFile()
		return err == nil && st.Outbox.Dead == 1
	}, 10*time.Second, time.Millisecond, "the message dies after its one attempt")
	var st idem.FileStats

	e = reopen(t, e, path, &idem.Options{Now: clock.Now, PruneInterval: -1,
		Outbox: idem.OutboxOptions{DeadLetterRetention: time.Hour}})
	clock.Advance(2 * day)
	_, err = e.Prune(bg)
	require.NoError(t, err)
	st, err = e.ScanFile()
	require.NoError(t, err)
	require.Equal(t, 1, st.Outbox.Dead, "kept for the 30 days it died under")
	var dead []*idem.Message
	require.NoError(t, e.Messages(func(m *idem.Message, err error) error {
		require.NoError(t, err)
		if m.Dead {
			dead = append(dead, m)
		}
		return nil
	}))
	require.Len(t, dead, 1)
	require.Equal(t, 30*day, dead[0].DeadLetterRetention)

	clock.Advance(28 * day)
	_, err = e.Prune(bg)
	require.NoError(t, err)
	st, err = e.ScanFile()
	require.NoError(t, err)
	require.Zero(t, st.Outbox.Dead, "expired at the end of its own window")
}

// testdata/file-v2.db was written by the last build of format version 2
// (testdata/README.md says what it holds), before the journal. Every later
// build must open it and replay it; a writable open migrates it to version
// 3, which builds of version 2 refuse (they would not replay the journal).
func TestOpenFormatVersion2File(t *testing.T) {
	path := copyFixture(t, "testdata/file-v2.db")
	clock := testkit.NewClock(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC).Add(3 * day))
	replays := func(t *testing.T, e *idem.Engine) {
		t.Helper()
		for key, want := range map[string]string{"order-1": `{"order":"o-1"}`, "empty": "", "tx-1": "tx-ok"} {
			fp := map[string]string{"order-1": "args-1", "empty": "args-e", "tx-1": "args-t"}[key]
			res, err := e.Do(bg, key, []byte(fp), mustNotRun(t))
			require.NoError(t, err, key)
			require.True(t, res.Replayed)
			require.Equal(t, want, string(res.Response), key)
		}
		_, err := e.Do(bg, "order-2", []byte("args-2"), mustNotRun(t))
		require.Error(t, err, "its stored error replayed")
		r, err := e.Get("order-3")
		require.NoError(t, err)
		require.Equal(t, idem.StateStarted, r.State)
		require.Equal(t, 7*day, r.Retention)
		st, err := e.ScanFile()
		require.NoError(t, err)
		require.Equal(t, 1, st.Started)
		require.GreaterOrEqual(t, st.Done, 5, "and the migrated open's own")
		require.Equal(t, 1, st.Outbox.Pending)
	}
	readOnlyChangesNothing(t, path, clock.Now, replays)
	t.Run("migrated", func(t *testing.T) {
		e, err := idem.Open(path, &idem.Options{Now: clock.Now, PruneInterval: -1})
		require.NoError(t, err)
		replays(t, e)
		res, err := e.Do(bg, "new", nil, func(context.Context) ([]byte, error) { return []byte("journaled"), nil })
		require.NoError(t, err)
		require.False(t, res.Replayed)
		require.NoError(t, e.Close())
		require.Equal(t, uint32(4), formatVersion(t, path), "Open migrated the file to format version 4")
		e, err = idem.Open(path, &idem.Options{Now: clock.Now, PruneInterval: -1})
		require.NoError(t, err)
		defer e.Close()
		replays(t, e)
		r, err := e.Get("new")
		require.NoError(t, err)
		require.Equal(t, "journaled", string(r.Response))
	})
}

// copyFixture copies the file of an earlier format at fixture (testdata/)
// into the test's directory and returns the copy's path: a test opens and
// migrates the copy, never the fixture.
func copyFixture(t *testing.T, fixture string) string {
	t.Helper()
	src, err := os.ReadFile(fixture)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), filepath.Base(fixture))
	require.NoError(t, os.WriteFile(path, src, 0o600))
	return path
}

// readOnlyChangesNothing opens the file at path read-only at now's clock,
// runs replays on it, and checks that the file's bytes are as before.
func readOnlyChangesNothing(t *testing.T, path string, now func() time.Time, replays func(*testing.T, *idem.Engine)) {
	t.Helper()
	src, err := os.ReadFile(path)
	require.NoError(t, err)
	t.Run("read-only", func(t *testing.T) {
		e, err := idem.OpenFile(path, &idem.BoltOptions{ReadOnly: true}, &idem.Options{Now: now})
		require.NoError(t, err)
		defer e.Close()
		replays(t, e)
	})
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, src, after, "a read-only Open changes nothing")
}
