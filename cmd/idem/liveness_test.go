package main

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// livenessFixture is a file written by a program with a 7-day window and
// RecoverRefuse, on the real clock's past:
//
//	week     done 3 days ago (7-day window: live)
//	stuck    started 30 days ago, fn panicked (kept until resolved)
//	stuck-2  started 30 days ago, fn panicked (kept until resolved)
//	gone     done 20 days ago (expired, its slot too)
func livenessFixture(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "idem.db")
	now := time.Now()
	write := func(at time.Time, key string, fn func(context.Context) ([]byte, error)) {
		e, err := idem.OpenFile(path, &idem.BoltOptions{NoSync: true}, &idem.Options{PruneInterval: -1, Retention: 7 * 24 * time.Hour,
			Recovery: idem.RecoverRefuse, Now: func() time.Time { return at }})
		require.NoError(t, err)
		defer func() { require.NoError(t, e.Close()) }()
		defer func() { _ = recover() }()
		_, _ = e.Do(context.Background(), key, []byte("args of "+key), fn)
	}
	ok := func(context.Context) ([]byte, error) { return []byte("v"), nil }
	crash := func(context.Context) ([]byte, error) { panic("crash") }
	write(now.Add(-3*24*time.Hour), "week", ok)
	write(now.Add(-30*24*time.Hour), "stuck", crash)
	write(now.Add(-30*24*time.Hour), "stuck-2", crash)
	write(now.Add(-20*24*time.Hour), "gone", ok)
	return path
}

// Every command that judges whether a record is live reads the rule from the
// file (each record's window and mark), not from --retention and --recovery:
// with their defaults, the tool sees what the program sees.
func TestCommandsJudgeLivenessFromTheFile(t *testing.T) {
	t.Parallel()
	path := livenessFixture(t)

	s := decode[statsJSON](t, idemDB(t, path, "--json", "stats").stdout)
	require.Equal(t, 3, s.Records.Live, "stats: %+v", s)
	require.Equal(t, 2, s.Records.Started)
	require.Equal(t, 1, s.Records.ExpiredPending)

	l := decode[lsJSON](t, idemDB(t, path, "--json", "ls").stdout)
	require.Equal(t, 3, l.Matched)
	keys := []string{}
	for _, r := range l.Records {
		keys = append(keys, r.Key)
		if r.State == "started" {
			require.Nil(t, r.ExpiresAt, "%s never expires", r.Key)
		} else {
			require.WithinDuration(t, time.Now().Add(4*24*time.Hour), *r.ExpiresAt, time.Minute, "7 days after it completed")
		}
	}
	require.Equal(t, []string{"stuck", "stuck-2", "week"}, keys)

	for _, rec := range l.Records {
		require.Equal(t, "168h0m0s", rec.Retention, "%s: the window it was written under", rec.Key)
		require.Equal(t, rec.State == "started", rec.KeptUntilResolved, rec.Key)
	}
	r := idemDB(t, path, "get", "week")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "retention    168h0m0s\n")
	require.Contains(t, idemDB(t, path, "get", "stuck").stdout, "retention    168h0m0s, kept until resolved\n")
	r = idemDB(t, path, "get", "gone")
	require.Equal(t, 1, r.code, "expired by its own window")

	c := decode[checkJSON](t, idemDB(t, path, "--json", "check").stdout)
	require.Equal(t, 2, c.Records.Started)
	require.Equal(t, 1, c.Records.Done)
	require.Equal(t, 1, c.Records.ExpiredPending)

	p := decode[pruneJSON](t, idemDB(t, path, "--json", "prune").stdout)
	require.Equal(t, 1, p.Pruned, "only the expired record")
	s = decode[statsJSON](t, idemDB(t, path, "--json", "stats").stdout)
	require.Equal(t, 3, s.Records.Live, "prune kept every live record")

	r = idemDB(t, path, "resolve", "stuck", "--response", "charged")
	require.Equal(t, 0, r.code, "resolve finds the kept record: %s", r.stderr)
	r = idemDB(t, path, "forget", "stuck-2")
	require.Equal(t, 0, r.code, "forget finds the kept record: %s", r.stderr)

	// The program, reopened, replays the resolved key.
	e, err := idem.Open(path, &idem.Options{PruneInterval: -1})
	require.NoError(t, err)
	defer e.Close()
	res, err := e.Do(context.Background(), "stuck", []byte("args of stuck"), func(context.Context) ([]byte, error) {
		t.Error("fn must not run: resolved")
		return nil, nil
	})
	require.NoError(t, err)
	require.Equal(t, "charged", string(res.Response))
}

// --retention and --recovery can only lengthen what the file says.
func TestLivenessFlagsOnlyLengthen(t *testing.T) {
	t.Parallel()
	path := livenessFixture(t)
	l := decode[lsJSON](t, idemDB(t, path, "--json", "--retention", "1s", "ls").stdout)
	require.Equal(t, 3, l.Matched, "a short --retention expires nothing early")
	l = decode[lsJSON](t, idemDB(t, path, "--json", "--retention", "600h", "ls").stdout)
	require.Equal(t, 4, l.Matched, "a longer one shows the record of 20 days ago")
	p := decode[pruneJSON](t, idemDB(t, path, "--json", "--retention", "1s", "prune").stdout)
	require.Equal(t, 1, p.Pruned, "and prunes nothing live")

	require.Equal(t, 0, idemDB(t, path, "forget", "week").code)
	r := idemDB(t, path, "--json", "ls", "--state", "done")
	require.JSONEq(t, `{"records": [], "matched": 0, "corrupt": 0}`, r.stdout, "no match is an empty list")
}

// Dead letters follow the same rule: each carries the dead-letter retention
// it died under, and the outbox commands and prune judge by it.
func TestOutboxCommandsJudgeDeadLettersFromTheFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "idem.db")
	died := time.Now().Add(-10 * 24 * time.Hour) // past the default 7 days, inside 30
	e, err := idem.OpenFile(path, &idem.BoltOptions{NoSync: true}, &idem.Options{PruneInterval: -1, Now: func() time.Time { return died },
		Outbox: idem.OutboxOptions{Dispatch: true, MaxAttempts: 1, DeadLetterRetention: 30 * 24 * time.Hour,
			Handlers: map[string]idem.Handler{"t": func(context.Context, idem.Message) error { return errors.New("no") }}}})
	require.NoError(t, err)
	enqueue(t, e, "order-1", func(tx *idem.Tx) error { return tx.Enqueue("t", []byte("p")) })
	waitOutbox(t, e, func(s idem.OutboxStats) bool { return s.Dead == 1 })
	require.NoError(t, e.Close())

	l := decode[outboxLsJSON](t, idemDB(t, path, "--json", "outbox", "ls", "--dead").stdout)
	require.Equal(t, 1, l.Matched, "outbox ls --dead lists the dead letter of 30 days' retention")
	require.WithinDuration(t, died.Add(30*24*time.Hour), *l.Messages[0].ExpiresAt, time.Second)
	s := decode[statsJSON](t, idemDB(t, path, "--json", "stats").stdout)
	require.Equal(t, 1, s.Outbox.Dead)
	require.Equal(t, 0, idemDB(t, path, "prune").code)
	l = decode[outboxLsJSON](t, idemDB(t, path, "--json", "outbox", "--dead-letter-retention", "1h", "ls", "--dead").stdout)
	require.Equal(t, 1, l.Matched, "prune kept it, and a short flag expires nothing early")
	r := idemDB(t, path, "outbox", "retry", "1")
	require.Equal(t, 0, r.code, r.stderr)
}
