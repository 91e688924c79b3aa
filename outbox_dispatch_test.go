package idem_test

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit"
)

// TestOutboxQuarantinesUndecodableMessages: a message damaged on disk moves
// to the dead letters byte for byte, is never handed to a handler, and holds
// back nothing, not even a later message of its ordering key; DropDead
// deletes it.
func TestOutboxQuarantinesUndecodableMessages(t *testing.T) {
	clock := testkit.NewClock(obStart)
	path := filepath.Join(t.TempDir(), "idem.db")
	file, opts := &idem.BoltOptions{NoSync: true}, &idem.Options{Now: clock.Now, PruneInterval: -1}
	e, err := idem.OpenFile(path, file, opts)
	require.NoError(t, err)
	for _, key := range []string{"order-1", "order-2", "order-3"} {
		require.NoError(t, obEnqueue(e, key, obMsg{"charge", "customer-9", key}))
	}
	require.NoError(t, e.Close())

	garbage := []byte("\x63not a message at all")
	db, err := bbolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, db.Update(func(tx *bbolt.Tx) error {
		return tx.Bucket(idem.RootName).Bucket(idem.OutboxName).Put(idem.U64Key(2), garbage)
	}))
	require.NoError(t, db.Close())

	e, rec := obReopen(t, path, file, opts)

	testkit.Eventually(t, "the two good messages delivered", nil, func() bool { return obStats(t, e).Delivered == 2 })
	var seqs []uint64
	for _, m := range rec.Delivered() {
		seqs = append(seqs, m.Seq)
	}
	require.Equal(t, []uint64{1, 3}, seqs, "seq 3, of the damaged message's ordering key, was not held back")

	type seen struct {
		seq  uint64
		dead bool
		err  error
	}
	var all []seen
	require.NoError(t, e.Messages(func(m *idem.Message, err error) error {
		all = append(all, seen{m.Seq, m.Dead, err})
		return nil
	}))
	require.Len(t, all, 1)
	require.Equal(t, uint64(2), all[0].seq)
	require.True(t, all[0].dead, "quarantined among the dead letters")
	require.ErrorIs(t, all[0].err, idem.ErrCorrupt)
	require.Equal(t, idem.OutboxStats{Corrupt: 1, Delivered: 2}, obStats(t, e), "counted as corrupt, not as a dead letter")
	require.NoError(t, e.View(func(tx *bbolt.Tx) error {
		root := tx.Bucket(idem.RootName)
		require.Nil(t, root.Bucket(idem.OutboxName).Get(idem.U64Key(2)), "out of the outbox")
		require.Equal(t, garbage, root.Bucket(idem.DeadName).Get(idem.U64Key(2)), "moved as it was")
		return nil
	}))

	require.NoError(t, e.DropDead(2))
	require.Equal(t, idem.OutboxStats{Delivered: 2}, obStats(t, e))
}

// TestOutboxPanickingHandler: a handler's panic is a failed attempt, with
// the panic's value and stack as the last error; the dispatcher goes on
// delivering other messages, and retries this one after its backoff.
func TestOutboxPanickingHandler(t *testing.T) {
	clock := testkit.NewClock(obStart)
	var rec testkit.Recorder
	panicking := func(ctx context.Context, m idem.Message) error {
		if m.Attempt == 1 {
			panic("boom in " + m.DownstreamKey)
		}
		return rec.Handler(nil)(ctx, m)
	}
	e, _ := obOpen(t, clock, idem.OutboxOptions{BaseBackoff: time.Second, MaxBackoff: time.Minute, MaxAttempts: 5,
		Handlers: map[string]idem.Handler{"panics": panicking, "works": rec.Handler(nil)}})

	obCall(t, e, "order-1", obMsg{"panics", "", "p"})
	obCall(t, e, "order-2", obMsg{"works", "", "w"})
	testkit.Eventually(t, "the panic recorded as a failed attempt and the other message delivered", nil, func() bool {
		ms := obMessages(t, e)
		return obStats(t, e).Delivered == 1 && len(ms) == 1 && ms[0].Failures == 1
	})
	m := obMessages(t, e)[0]
	require.Equal(t, "order-1/0", m.DownstreamKey)
	require.Contains(t, m.LastError, "handler panicked: boom in order-1/0")
	require.Contains(t, m.LastError, "goroutine ", "with the stack")
	require.True(t, m.NextAttemptAt.After(obStart), "retried after a backoff")
	require.Equal(t, []string{"order-2/0"}, downstreamKeys(rec.Delivered()))

	testkit.Eventually(t, "the retry delivered", func() { clock.Advance(time.Second) }, func() bool { return obStats(t, e).Delivered == 2 })
	require.Equal(t, []string{"order-2/0", "order-1/0"}, downstreamKeys(rec.Delivered()))
	require.Equal(t, 2, rec.Delivered()[1].Attempt)
}

// TestOutboxTwoBackoffTimers: two ordering keys wait for their backoffs at
// once; each timer fires at its own time, the earlier without the later.
func TestOutboxTwoBackoffTimers(t *testing.T) {
	clock := testkit.NewClock(obStart)
	var rec testkit.Recorder
	h := rec.Handler(func(m idem.Message) error {
		if m.Attempt == 1 {
			return errors.New("try again")
		}
		return nil
	})
	e, _ := obOpen(t, clock, idem.OutboxOptions{BaseBackoff: time.Second, MaxBackoff: time.Minute, MaxAttempts: 5,
		Handlers: map[string]idem.Handler{"t": h}})
	obCall(t, e, "order-1", obMsg{"t", "", "1"})
	obCall(t, e, "order-2", obMsg{"t", "", "2"})
	testkit.Eventually(t, "both first attempts failed", nil, func() bool {
		ms := obMessages(t, e)
		return len(ms) == 2 && ms[0].Failures == 1 && ms[1].Failures == 1
	})
	ms := obMessages(t, e)
	slices.SortFunc(ms, func(a, b *idem.Message) int { return a.NextAttemptAt.Compare(b.NextAttemptAt) })
	first, second := ms[0], ms[1]
	require.True(t, first.NextAttemptAt.After(obStart), "both wait for a backoff")

	if first.NextAttemptAt.Before(second.NextAttemptAt) {
		clock.Advance(first.NextAttemptAt.Sub(obStart))
		testkit.Eventually(t, "the earlier timer fired", nil, func() bool { return obStats(t, e).Delivered == 1 })
		require.Equal(t, []string{first.DownstreamKey}, downstreamKeys(rec.Delivered()))
		left := obMessages(t, e)
		require.Len(t, left, 1, "the later timer has not fired: its time has not come")
		require.Equal(t, second.DownstreamKey, left[0].DownstreamKey)
		require.Equal(t, 1, left[0].Failures)
	}
	clock.Advance(second.NextAttemptAt.Sub(clock.Now()))
	testkit.Eventually(t, "the later timer fired", nil, func() bool { return obStats(t, e).Delivered == 2 })
	require.ElementsMatch(t, []string{"order-1/0", "order-2/0"}, downstreamKeys(rec.Delivered()))
	require.Equal(t, idem.OutboxStats{Delivered: 2}, obStats(t, e))
}

func downstreamKeys(ms []idem.Message) []string {
	var keys []string
	for _, m := range ms {
		keys = append(keys, m.DownstreamKey)
	}
	return keys
}
