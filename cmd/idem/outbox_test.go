package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/idemkit/idem"
)

const (
	cardPayload   = `{"card":"4242 4242 4242 4242","amount":1999}`
	refundPayload = "\xff\x00\xfe"
	shipErr       = "carrier down\nretry later"
)

// outboxFixture creates an idem file whose outbox holds, on the fixture
// clock (base):
//
//	seq 1  charge_card  order-1/0  dead after 1 failed attempt, "card declined"
//	seq 2  ship         order-2/0  pending, retrying: 1 failed attempt, next in 30 to 60 minutes
//	seq 3  charge_card  order-3/0  pending, no attempt yet
//	seq 4  send_email   order-3/1  pending, empty payload
//	seq 5  refund       order-4/0  pending, ordering key order-1, a payload that is not UTF-8
func outboxFixture(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "idem.db")
	failWith := func(msg string) idem.Handler {
		return func(context.Context, idem.Message) error { return errors.New(msg) }
	}
	// One attempt, and charge_card's handler fails: a dead letter.
	outboxSession(t, path, idem.OutboxOptions{
		MaxAttempts: 1, BaseBackoff: time.Millisecond,
		Handlers: map[string]idem.Handler{"charge_card": failWith("card declined")},
	}, func(e *idem.Engine) {
		enqueue(t, e, "order-1", func(tx *idem.Tx) error { return tx.Enqueue("charge_card", []byte(cardPayload)) })
	}, func(s idem.OutboxStats) bool { return s.Dead == 1 })
	// ship's handler fails once; the clock stands still, so its retry, an
	// hour's backoff away, never comes. The other topics have no handler.
	outboxSession(t, path, idem.OutboxOptions{
		MaxAttempts: 5, BaseBackoff: time.Hour,
		Handlers: map[string]idem.Handler{"ship": failWith(shipErr)},
	}, func(e *idem.Engine) {
		enqueue(t, e, "order-2", func(tx *idem.Tx) error { return tx.Enqueue("ship", []byte("parcel")) })
		enqueue(t, e, "order-3", func(tx *idem.Tx) error {
			return errors.Join(tx.Enqueue("charge_card", []byte(cardPayload)), tx.Enqueue("send_email", []byte{}))
		})
		enqueue(t, e, "order-4", func(tx *idem.Tx) error {
			return tx.EnqueueOrdered("refund", "order-1", []byte(refundPayload))
		})
	}, func(s idem.OutboxStats) bool { return s.Retrying == 1 })
	return path
}

// outboxSession opens path on the fixture clock with ob and its dispatcher,
// runs calls, waits until done holds (at most 10 seconds) and closes.
func outboxSession(t *testing.T, path string, ob idem.OutboxOptions, calls func(*idem.Engine), done func(idem.OutboxStats) bool) {
	t.Helper()
	ob.Dispatch = true
	e, err := idem.OpenFile(path, &idem.BoltOptions{NoSync: true}, &idem.Options{PruneInterval: -1, Now: func() time.Time { return base }, Outbox: ob})
	require.NoError(t, err)
	defer func() { require.NoError(t, e.Close()) }()
	calls(e)
	waitOutbox(t, e, done)
}

// waitOutbox waits until e's outbox counts satisfy done, at most 10 seconds.
func waitOutbox(t *testing.T, e *idem.Engine, done func(idem.OutboxStats) bool) {
	t.Helper()
	require.Eventually(t, func() bool {
		s, err := e.ScanFile()
		return err == nil && done(s.Outbox)
	}, 10*time.Second, time.Millisecond)
}

// enqueue runs a DoTx call with key whose fn is enqueue.
func enqueue(t *testing.T, e *idem.Engine, key string, enqueue func(*idem.Tx) error) {
	t.Helper()
	_, err := e.DoTx(context.Background(), key, []byte("args of "+key), func(_ context.Context, tx *idem.Tx) ([]byte, error) {
		return nil, enqueue(tx)
	})
	require.NoError(t, err)
}

// seqColumn is the first field of every line of an outbox ls table after
// its header, up to the notes in parentheses below it.
func seqColumn(out string) []string {
	var seqs []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n")[1:] {
		if strings.HasPrefix(l, "(") {
			break
		}
		seqs = append(seqs, strings.Fields(l)[0])
	}
	return seqs
}

func TestOutboxHumanOutput(t *testing.T) {
	t.Parallel()
	// One file for every case: the commands only read it, all at once.
	path := outboxFixture(t)
	at := base.Format(baseFmt)
	deadExpires := base.Add(idem.DefaultOutboxDeadLetterRetention).Format(baseFmt)
	tests := []struct {
		name  string
		args  []string
		check func(t *testing.T, stdout string)
	}{
		{"ls lists the pending messages in enqueue order with their columns", []string{"outbox", "ls"}, func(t *testing.T, out string) {
			require.Equal(t, []string{"SEQ", "TOPIC", "DOWNSTREAM", "KEY", "ORDERING", "KEY", "ATTEMPT", "NEXT", "ATTEMPT", "PAYLOAD", "LAST", "ERROR"},
				strings.Fields(strings.SplitN(out, "\n", 2)[0]))
			require.Equal(t, []string{"2", "3", "4", "5"}, seqColumn(out))
			require.True(t, strings.HasSuffix(out, "\n(and 1 dead letter; idem outbox ls --dead lists them)\n"), "the dead letter is mentioned:\n%s", out)
			ship := row(t, out, "2")
			require.Equal(t, []string{"2", "ship", "order-2/0", "order-2", "1"}, ship[:5])
			next, err := time.Parse(time.RFC3339, ship[5])
			require.NoError(t, err)
			require.WithinRange(t, next, base.Add(30*time.Minute), base.Add(time.Hour))
			require.Equal(t, []string{"6", "B", "carrier", "down", "retry", "later"}, ship[6:], "the error on one line")
			require.Equal(t, []string{"3", "charge_card", "order-3/0", "order-3", "0", "-", "44", "B", "-"}, row(t, out, "3"))
			require.Equal(t, []string{"4", "send_email", "order-3/1", "order-3", "0", "-", "0", "B", "-"}, row(t, out, "4"))
			require.Equal(t, []string{"5", "refund", "order-4/0", "order-1", "0", "-", "3", "B", "-"}, row(t, out, "5"))
			require.NotContains(t, out, "4242", "ls prints no payload")
			require.NotContains(t, out, "parcel", "ls prints no payload")
		}},
		{"ls --dead lists the dead letters with when they died and expire", []string{"outbox", "ls", "--dead"}, func(t *testing.T, out string) {
			require.Equal(t, []string{"SEQ", "TOPIC", "DOWNSTREAM", "KEY", "ORDERING", "KEY", "ATTEMPTS", "DEAD", "AT", "EXPIRES", "PAYLOAD", "LAST", "ERROR"},
				strings.Fields(strings.SplitN(out, "\n", 2)[0]))
			require.Equal(t, []string{"1"}, seqColumn(out))
			require.Equal(t, []string{"1", "charge_card", "order-1/0", "order-1", "1", at, deadExpires, "44", "B", "card", "declined"}, row(t, out, "1"))
			require.NotContains(t, out, "4242", "ls prints no payload")
		}},
		{"ls --topic lists one topic", []string{"outbox", "ls", "--topic", "charge_card"}, func(t *testing.T, out string) {
			require.Equal(t, []string{"3"}, seqColumn(out))
		}},
		{"ls --topic with no match says so", []string{"outbox", "ls", "--topic", "no such topic"}, func(t *testing.T, out string) {
			require.Equal(t, "no pending messages of topic \"no such topic\"\n", out)
		}},
		{"ls --limit lists the first messages and says how many matched", []string{"outbox", "ls", "--limit", "2"}, func(t *testing.T, out string) {
			lines := strings.Split(strings.TrimSpace(out), "\n")
			require.Len(t, lines, 5)
			require.Equal(t, []string{"2", "3"}, []string{strings.Fields(lines[1])[0], strings.Fields(lines[2])[0]})
			require.Equal(t, "(2 of 4 pending messages; raise --limit for more)", lines[3])
			require.Equal(t, "(and 1 dead letter; idem outbox ls --dead lists them)", lines[4])
		}},
		{"ls --dead with a short retention expires nothing early", []string{"outbox", "--dead-letter-retention", "30m", "ls", "--dead"}, func(t *testing.T, out string) {
			require.Equal(t, []string{"1"}, seqColumn(out), "each dead letter keeps the retention it died under")
		}},
		{"get shows a dead letter and its payload", []string{"outbox", "get", "1"}, func(t *testing.T, out string) {
			require.Equal(t, "seq             1\n"+
				"state           dead\n"+
				"topic           charge_card\n"+
				"key             order-1 (message 0 of the call)\n"+
				"downstream key  order-1/0\n"+
				"ordering key    order-1\n"+
				"attempts        1 failed\n"+
				"enqueued        "+at+"\n"+
				"dead at         "+at+"\n"+
				"expires         "+deadExpires+"\n"+
				"last error      \"card declined\"\n"+
				"payload         44 B\n"+
				cardPayload+"\n", out)
		}},
		{"get shows a pending message's whole last error", []string{"outbox", "get", "2"}, func(t *testing.T, out string) {
			require.Contains(t, out, "state           pending\n")
			require.Contains(t, out, "last error      \"carrier down\\nretry later\"\n")
			require.Regexp(t, `next attempt    \S+\n`, out)
			require.True(t, strings.HasSuffix(out, "payload         6 B\nparcel\n"), out)
		}},
		{"get of a message not tried yet", []string{"outbox", "get", "3"}, func(t *testing.T, out string) {
			require.Contains(t, out, "next attempt    at once\n")
			require.Contains(t, out, "last error      -\n")
		}},
		{"get tells an empty payload from none", []string{"outbox", "get", "4"}, func(t *testing.T, out string) {
			require.True(t, strings.HasSuffix(out, "payload         0 B\n"), out)
		}},
		{"get shows a binary payload in base64", []string{"outbox", "get", "5"}, func(t *testing.T, out string) {
			require.Contains(t, out, "ordering key    order-1\n")
			require.Contains(t, out, "payload         3 B, not UTF-8; base64 below (or outbox get --raw)\n/wD+\n")
		}},
		{"get --raw writes the payload bytes only", []string{"outbox", "get", "--raw", "5"}, func(t *testing.T, out string) {
			require.Equal(t, refundPayload, out)
		}},
		{"stats counts the outbox messages", []string{"stats"}, func(t *testing.T, out string) {
			require.Contains(t, out, "outbox   4 pending (1 retrying), 1 dead letter, 0 corrupt\n")
		}},
		{"stats with a short dead-letter retention expires nothing early", []string{"stats", "--dead-letter-retention", "30m"}, func(t *testing.T, out string) {
			require.Contains(t, out, "outbox   4 pending (1 retrying), 1 dead letter, 0 corrupt\n")
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := idemDB(t, path, tt.args...)
			require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
			require.Empty(t, r.stderr)
			tt.check(t, r.stdout)
		})
	}
}

func TestOutboxJSONOutput(t *testing.T) {
	t.Parallel()
	path := outboxFixture(t)
	tests := []struct {
		name  string
		args  []string
		check func(t *testing.T, stdout string)
	}{
		{"ls", []string{"outbox", "ls"}, func(t *testing.T, out string) {
			l := decode[outboxLsJSON](t, out)
			require.False(t, l.Dead)
			require.Equal(t, 4, l.Matched)
			require.Empty(t, l.Corrupt)
			require.Len(t, l.Messages, 4)
			ship := l.Messages[0]
			require.Equal(t, uint64(2), ship.Seq)
			require.Equal(t, "ship", ship.Topic)
			require.Equal(t, "order-2", ship.Key)
			require.Equal(t, 0, ship.Index)
			require.Equal(t, "order-2/0", ship.DownstreamKey)
			require.Equal(t, "order-2", ship.OrderingKey)
			require.Equal(t, 1, ship.Attempt)
			require.Equal(t, base, ship.EnqueuedAt)
			require.WithinRange(t, *ship.NextAttemptAt, base.Add(30*time.Minute), base.Add(time.Hour))
			require.Equal(t, shipErr, *ship.LastError, "all of it")
			require.Equal(t, len("parcel"), *ship.PayloadSize)
			require.False(t, ship.Dead)
			require.Nil(t, ship.DeadAt)
			require.Nil(t, ship.ExpiresAt)

			email := l.Messages[2]
			require.Equal(t, "order-3/1", email.DownstreamKey)
			require.Equal(t, 1, email.Index)
			require.Nil(t, email.NextAttemptAt, "at once")
			require.Nil(t, email.LastError)
			require.Equal(t, 0, *email.PayloadSize)
			require.Equal(t, "order-1", l.Messages[3].OrderingKey)
		}},
		{"ls --dead", []string{"outbox", "ls", "--dead"}, func(t *testing.T, out string) {
			l := decode[outboxLsJSON](t, out)
			require.True(t, l.Dead)
			require.Equal(t, 1, l.Matched)
			m := l.Messages[0]
			require.Equal(t, uint64(1), m.Seq)
			require.Equal(t, "order-1/0", m.DownstreamKey)
			require.Equal(t, 1, m.Attempt)
			require.True(t, m.Dead)
			require.Equal(t, base, *m.DeadAt)
			require.Equal(t, base.Add(idem.DefaultOutboxDeadLetterRetention), *m.ExpiresAt)
			require.Nil(t, m.NextAttemptAt)
			require.Equal(t, "card declined", *m.LastError)
			require.NotContains(t, out, "4242", "no payload")
		}},
		{"ls with no match is an empty list", []string{"outbox", "ls", "--topic", "nope"}, func(t *testing.T, out string) {
			require.JSONEq(t, `{"dead": false, "messages": [], "matched": 0, "corrupt": [], "others": 0}`, out)
		}},
		{"get of text", []string{"outbox", "get", "1"}, func(t *testing.T, out string) {
			g := decode[outboxGetJSON](t, out)
			require.Equal(t, uint64(1), g.Seq)
			require.True(t, g.Dead)
			require.Equal(t, cardPayload, *g.Payload)
			require.Equal(t, "utf-8", g.PayloadEncoding)
		}},
		{"get of bytes", []string{"outbox", "get", "5"}, func(t *testing.T, out string) {
			g := decode[outboxGetJSON](t, out)
			require.Equal(t, "/wD+", *g.Payload)
			require.Equal(t, "base64", g.PayloadEncoding)
		}},
		{"get of an empty payload", []string{"outbox", "get", "4"}, func(t *testing.T, out string) {
			g := decode[outboxGetJSON](t, out)
			require.Equal(t, "", *g.Payload)
		}},
		{"stats", []string{"stats"}, func(t *testing.T, out string) {
			s := decode[statsJSON](t, out)
			require.Equal(t, 4, s.Outbox.Pending)
			require.Equal(t, 1, s.Outbox.Retrying)
			require.Equal(t, 1, s.Outbox.Dead)
			require.Equal(t, 0, s.Outbox.Corrupt)
			require.Equal(t, 4, s.Records.Done, "the DoTx calls")
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := idemDB(t, path, append([]string{"--json"}, tt.args...)...)
			require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
			require.Empty(t, r.stderr)
			tt.check(t, r.stdout)
		})
	}
}

func TestOutboxRetryAndDrop(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStdout string
		wantStderr string
		// The outbox afterwards.
		wantPending []uint64
		wantDead    []uint64
	}{
		{"retry puts the dead letter back first", []string{"outbox", "retry", "1"}, 0,
			"retried 1: pending again, attempts reset; the program's dispatcher delivers it\n", "",
			[]uint64{1, 2, 3, 4, 5}, nil},
		{"retry --json", []string{"--json", "outbox", "retry", "1"}, 0,
			`{"op": "retry", "done": [1], "failed": []}`, "",
			[]uint64{1, 2, 3, 4, 5}, nil},
		{"drop deletes the dead letter", []string{"outbox", "drop", "1"}, 0,
			"dropped 1: deleted, never to be delivered\n", "",
			[]uint64{2, 3, 4, 5}, nil},
		{"drop --json", []string{"--json", "outbox", "drop", "1"}, 0,
			`{"op": "drop", "done": [1], "failed": []}`, "",
			[]uint64{2, 3, 4, 5}, nil},
		{"retry of a pending message or unknown seq fails, the others go on", []string{"outbox", "retry", "2", "1", "99", "1"}, 1,
			"retried 1: pending again, attempts reset; the program's dispatcher delivers it\n",
			"idem: outbox retry 2: message 2 is pending, not a dead letter\n" +
				"idem: outbox retry 99: no dead letter 99 (delivered, dropped, expired or never enqueued)\n",
			[]uint64{1, 2, 3, 4, 5}, nil},
		{"drop --json reports the failures too", []string{"--json", "outbox", "drop", "99", "1"}, 1,
			`{"op": "drop", "done": [1], "failed": [{"seq": 99, "error": "no dead letter 99 (delivered, dropped, expired or never enqueued)"}]}`,
			"idem: outbox drop 99: no dead letter 99 (delivered, dropped, expired or never enqueued)\n",
			[]uint64{2, 3, 4, 5}, nil},
		{"drop of a pending message is refused", []string{"outbox", "drop", "3"}, 1,
			"", "idem: outbox drop 3: message 3 is pending, not a dead letter\n",
			[]uint64{2, 3, 4, 5}, []uint64{1}},
		{"retry under a short --dead-letter-retention finds the dead letter", []string{"outbox", "--dead-letter-retention", "30m", "retry", "1"}, 0,
			"retried 1: pending again, attempts reset; the program's dispatcher delivers it\n", "",
			[]uint64{1, 2, 3, 4, 5}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			path := outboxFixture(t)
			r := idemDB(t, path, tt.args...)
			require.Equal(t, tt.wantCode, r.code, "stderr: %s", r.stderr)
			require.Equal(t, tt.wantStderr, r.stderr)
			if strings.HasPrefix(tt.wantStdout, "{") {
				require.JSONEq(t, tt.wantStdout, r.stdout)
			} else {
				require.Equal(t, tt.wantStdout, r.stdout)
			}
			require.Equal(t, tt.wantPending, listSeqs(t, path, false))
			require.Equal(t, tt.wantDead, listSeqs(t, path, true))
			s := decode[statsJSON](t, idemDB(t, path, "--json", "stats").stdout)
			require.Equal(t, len(tt.wantPending), s.Outbox.Pending)
			require.Equal(t, len(tt.wantDead), s.Outbox.Dead)
		})
	}
}

// listSeqs is the seqs that outbox ls --json lists, dead or pending.
func listSeqs(t *testing.T, path string, dead bool) []uint64 {
	t.Helper()
	args := []string{"--json", "outbox", "ls"}
	if dead {
		args = append(args, "--dead")
	}
	r := idemDB(t, path, args...)
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	var seqs []uint64
	for _, m := range decode[outboxLsJSON](t, r.stdout).Messages {
		seqs = append(seqs, m.Seq)
	}
	return seqs
}

func TestOutboxRetriedDeadLetterIsDelivered(t *testing.T) {
	t.Parallel()
	path := outboxFixture(t)
	r := idemDB(t, path, "outbox", "retry", "1")
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)

	// The program, with a charge_card handler that works now.
	var mu sync.Mutex
	charged := map[string]string{} // downstream key → payload
	outboxSession(t, path, idem.OutboxOptions{Handlers: map[string]idem.Handler{
		"charge_card": func(_ context.Context, m idem.Message) error {
			mu.Lock()
			defer mu.Unlock()
			charged[m.DownstreamKey] = string(m.Payload)
			return nil
		},
	}}, func(*idem.Engine) {}, func(s idem.OutboxStats) bool { return s.Pending == 3 })
	require.Equal(t, map[string]string{"order-1/0": cardPayload, "order-3/0": cardPayload}, charged)
	require.Equal(t, []uint64{2, 4, 5}, listSeqs(t, path, false))
}

func TestOutboxErrors(t *testing.T) {
	t.Parallel()
	path := outboxFixture(t)
	const usage = "Run 'idem --help' for usage.\n"
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStderr string
	}{
		{"retry of a non-numeric seq is a usage error", []string{"outbox", "retry", "1", "abc"}, 2,
			"idem: \"abc\" is not a message sequence number (a positive integer, as outbox ls shows)\n" + usage},
		{"drop of seq 0 is a usage error", []string{"outbox", "drop", "0"}, 2,
			"idem: \"0\" is not a message sequence number (a positive integer, as outbox ls shows)\n" + usage},
		{"get of a non-numeric seq is a usage error", []string{"outbox", "get", "order-1"}, 2,
			"idem: \"order-1\" is not a message sequence number (a positive integer, as outbox ls shows)\n" + usage},
		{"retry without a seq is a usage error", []string{"outbox", "retry"}, 2,
			"idem: retry: requires at least 1 arg(s), only received 0 (usage: idem outbox retry SEQ... [flags])\n" + usage},
		{"get of two seqs is a usage error", []string{"outbox", "get", "1", "2"}, 2,
			"idem: get: accepts 1 arg(s), received 2 (usage: idem outbox get SEQ [flags])\n" + usage},
		{"ls with a negative limit is a usage error", []string{"outbox", "ls", "--limit", "-1"}, 2,
			"idem: --limit must not be negative\n" + usage},
		{"a negative dead-letter retention is a usage error", []string{"outbox", "--dead-letter-retention", "-1s", "ls"}, 2,
			"idem: --dead-letter-retention must not be negative, not -1s\n" + usage},
		{"an unknown outbox command is a usage error", []string{"outbox", "purge"}, 2,
			"idem: outbox: unknown command \"purge\" for \"idem outbox\" (usage: idem outbox [flags])\n" + usage},
		{"get of an unknown seq is not found", []string{"outbox", "get", "99"}, 1,
			"idem: outbox get 99: no such message (delivered, dropped, expired or never enqueued)\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := idemDB(t, path, tt.args...)
			require.Equal(t, tt.wantCode, r.code)
			require.Equal(t, tt.wantStderr, r.stderr)
			require.Empty(t, r.stdout)
		})
	}
	require.Equal(t, []uint64{1}, listSeqs(t, path, true), "unchanged")
}

// corruptMessages writes a corrupt pending message (seq 8) and a corrupt
// dead letter (seq 9) into the idem file at path.
func corruptMessages(t *testing.T, path string) {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, db.Update(func(tx *bbolt.Tx) error {
		root := tx.Bucket(rootBucket)
		return errors.Join(
			root.Bucket(outboxBucket).Put(seqKey(8), []byte("not a message")),
			root.Bucket(deadBucket).Put(seqKey(9), []byte("not a message either")))
	}))
	require.NoError(t, db.Close())
}

func TestOutboxCorruptMessages(t *testing.T) {
	t.Parallel()
	path := outboxFixture(t)
	corruptMessages(t, path)

	r := idemDB(t, path, "outbox", "ls")
	require.Equal(t, 0, r.code)
	require.Equal(t, "idem: 1 corrupt message not listed: seq 8\n", r.stderr)
	require.Equal(t, []string{"2", "3", "4", "5"}, seqColumn(r.stdout))

	r = idemDB(t, path, "outbox", "ls", "--dead")
	require.Equal(t, 0, r.code)
	require.Equal(t, "idem: 1 corrupt message not listed: seq 9; idem outbox drop SEQ deletes one\n", r.stderr)
	require.Equal(t, []uint64{9}, decode[outboxLsJSON](t, idemDB(t, path, "--json", "outbox", "ls", "--dead").stdout).Corrupt)

	s := decode[statsJSON](t, idemDB(t, path, "--json", "stats").stdout)
	require.Equal(t, 2, s.Outbox.Corrupt)
	require.Equal(t, 4, s.Outbox.Pending, "decoded ones only")

	r = idemDB(t, path, "outbox", "get", "9")
	require.Equal(t, 1, r.code)
	require.Regexp(t, `^idem: outbox get 9: .*corrupt record: .+\n$`, r.stderr)

	r = idemDB(t, path, "outbox", "retry", "9")
	require.Equal(t, 1, r.code)
	require.Equal(t, "idem: outbox retry 9: dead letter 9 fails to decode; it can only be dropped\n", r.stderr)

	r = idemDB(t, path, "outbox", "drop", "9")
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	require.Equal(t, 1, decode[statsJSON](t, idemDB(t, path, "--json", "stats").stdout).Outbox.Corrupt, "seq 8 left")
}

// outboxCommands is one invocation of every outbox command, against path.
func outboxCommands(path string) map[string][]string {
	return map[string][]string{
		"outbox ls":    {"--db", path, "outbox", "ls"},
		"outbox get":   {"--db", path, "outbox", "get", "1"},
		"outbox retry": {"--db", path, "outbox", "retry", "1"},
		"outbox drop":  {"--db", path, "outbox", "drop", "1"},
	}
}

func TestOutboxFileInUse(t *testing.T) {
	t.Parallel()
	path := outboxFixture(t)
	requireInUse(t, path, outboxCommands(path))
}

func TestOutboxMissingFileIsNotCreated(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "missing.db")
	requireNotCreated(t, path, outboxCommands(path))
}

// TestReadOnlyCommands checks that the commands that only read open the
// file read-only: they share it with a read-only engine, change no byte of
// it, while the commands that write are refused as if a program held it.
func TestReadOnlyCommands(t *testing.T) {
	t.Parallel()
	path := outboxFixture(t)
	before, err := os.ReadFile(path)
	require.NoError(t, err)
	ro, err := idem.OpenFile(path, &idem.BoltOptions{LockTimeout: time.Second, ReadOnly: true}, nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, ro.Close()) }()

	for _, args := range [][]string{
		{"stats"}, {"ls"}, {"get", "order-1"}, {"check"},
		{"outbox", "ls"}, {"outbox", "ls", "--dead"}, {"outbox", "get", "1"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			for _, format := range []string{"human", "json"} {
				a := args
				if format == "json" {
					a = append([]string{"--json"}, a...)
				}
				r := idemDB(t, path, a...)
				require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
			}
		})
	}
	for _, args := range [][]string{{"outbox", "retry", "1"}, {"outbox", "drop", "1"}, {"forget", "order-1"}} {
		t.Run(strings.Join(args, " ")+" is refused", func(t *testing.T) {
			r := idemDB(t, path, args...)
			require.Equal(t, 1, r.code)
			require.Contains(t, r.stderr, "is in use by another program")
		})
	}
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, before, after, "no byte changed")
}
