package main

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// TestJSONErrors: with --json, a failure prints one JSON error object on
// stdout (and its line on stderr), whatever stage it fails at.
func TestJSONErrors(t *testing.T) {
	t.Parallel()
	path := fixture(t)
	missing := filepath.Join(t.TempDir(), "missing.db")
	for _, tc := range []struct {
		name string
		args []string
		kind string
		code int
	}{
		{"a missing file", []string{"--db", missing, "--json", "stats"}, "no_file", 1},
		{"a key not found", []string{"--db", path, "--json", "get", "no-such-key"}, "not_found", 1},
		{"an invalid key", []string{"--db", path, "--json", "get", "\xff"}, "invalid_key", 1},
		{"resolve of a done record", []string{"--db", path, "--json", "resolve", "order-1", "--response", "x"}, "state", 1},
		{"a usage error", []string{"--db", path, "--json", "get"}, "usage", 2},
		{"an unknown flag, --json after it", []string{"--db", path, "ls", "--bogus", "--json"}, "usage", 2},
		{"an unknown command", []string{"--json", "nope"}, "usage", 2},
		{"a flag with its value left out", []string{"--db", path, "--json", "ls", "--state", "--limit", "1"}, "usage", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := idemCmd(t, nil, "", tc.args...)
			require.Equal(t, tc.code, r.code, r.stderr)
			doc := decode[errorDocJSON](t, r.stdout)
			require.Equal(t, tc.kind, doc.Error.Kind, doc.Error.Message)
			require.Equal(t, tc.code, doc.Error.ExitStatus)
			require.True(t, strings.HasPrefix(doc.Error.Message, "idem: "), doc.Error.Message)
			require.Equal(t, doc.Error.Message, strings.SplitN(r.stderr, "\n", 2)[0], "the same line on stderr")
		})
	}
	t.Run("without --json, nothing on stdout", func(t *testing.T) {
		r := idemCmd(t, nil, "", "--db", path, "get", "no-such-key")
		require.Equal(t, 1, r.code)
		require.Empty(t, r.stdout)
		require.NotEmpty(t, r.stderr)
	})
}

// TestFlagValueLeftOut: a flag that wants a value and is followed by another
// flag is a usage error, not that flag's name taken as the value.
func TestFlagValueLeftOut(t *testing.T) {
	t.Parallel()
	path := fixture(t)
	for _, args := range [][]string{
		{"ls", "--state", "--db", path},
		{"--db", path, "ls", "--state", "--limit", "3"},
		{"--db", path, "ls", "--state", "-h"},
		{"--db", "--json", "stats"},
		{"--db", path, "resolve", "order-3", "--response", "--code", "x"},
	} {
		r := idemCmd(t, nil, "", args...)
		require.Equal(t, 2, r.code, "%q: %s", args, r.stderr)
		require.Contains(t, r.stderr, "needs a value; it was followed by the flag -", "%q", args)
	}
	// A value that only looks like a flag is taken as given.
	r := idemCmd(t, nil, "", "--db", path, "ls", "--state", "--started")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, `unknown state "--started"`)
	r = idemCmd(t, nil, "", "--db", path, "ls", "--state", "done")
	require.Equal(t, 0, r.code, r.stderr)
}

func TestShrink(t *testing.T) {
	for _, tc := range []struct {
		src, dst int64
		want     string
	}{
		{1 << 30, 32 << 10, "99% smaller"}, // 99.997%: never "100% smaller"
		{64 << 10, 32 << 10, "50% smaller"},
		{1000, 999, "less than 1% smaller"},
		{1000, 1000, "no smaller"},
		{1000, 2000, "no smaller"},
		{0, 0, "no smaller"},
	} {
		require.Equal(t, tc.want, shrink(tc.src, tc.dst), "%d → %d", tc.src, tc.dst)
	}
}

// TestOutboxLsPointsToDeadLetters: an outbox with no pending message but a
// dead letter is not reported as empty.
func TestOutboxLsPointsToDeadLetters(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "idem.db")
	outboxSession(t, path, idem.OutboxOptions{
		MaxAttempts: 1, BaseBackoff: time.Millisecond,
		Handlers: map[string]idem.Handler{"charge_card": func(context.Context, idem.Message) error { return errors.New("card declined") }},
	}, func(e *idem.Engine) {
		enqueue(t, e, "order-1", func(tx *idem.Tx) error { return tx.Enqueue("charge_card", []byte(cardPayload)) })
	}, func(s idem.OutboxStats) bool { return s.Dead == 1 })

	r := idemDB(t, path, "outbox", "ls")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, "no pending messages\n(and 1 dead letter; idem outbox ls --dead lists them)\n", r.stdout)
	r = idemDB(t, path, "--json", "outbox", "ls")
	require.Equal(t, 0, r.code, r.stderr)
	ls := decode[outboxLsJSON](t, r.stdout)
	require.Zero(t, ls.Matched)
	require.Equal(t, 1, ls.Others)
	r = idemDB(t, path, "outbox", "ls", "--dead")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, []string{"1"}, seqColumn(r.stdout))
}
