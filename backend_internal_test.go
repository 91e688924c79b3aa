package idem

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemcore"
)

// The outbox operations of the bbolt backend, as the dispatcher uses them:
// ClaimDue claims only the due heads of the ordering keys, each once until
// Delivered or Failed ends its claim, and reports the next attempt it knows;
// Delivered and Failed move a message on; PruneDead deletes in bounded
// batches.
func TestBoltBackendOutboxOperations(t *testing.T) {
	e, err := Open(filepath.Join(t.TempDir(), "idem.db"), &Options{PruneInterval: -1})
	require.NoError(t, err)
	defer e.Close()
	ctx := context.Background()
	enqueue := func(key string, topics ...string) {
		_, err := e.DoTx(ctx, key, nil, func(_ context.Context, tx *Tx) ([]byte, error) {
			for _, topic := range topics {
				if err := tx.Enqueue(topic, []byte(topic)); err != nil {
					return nil, err
				}
			}
			return nil, nil
		})
		require.NoError(t, err)
	}
	enqueue("a", "a1", "a2")
	enqueue("b", "b1")
	b := e.b
	claim := func(now time.Time, limit int) ([]*idemcore.Message, []string, time.Time) {
		due, err := b.ClaimDue(ctx, now, limit)
		require.NoError(t, err)
		require.Empty(t, due.Quarantined)
		var topics []string
		for _, m := range due.Messages {
			topics = append(topics, m.Topic)
		}
		return due.Messages, topics, due.Next
	}
	now := e.c.Now()
	limited, topics, _ := claim(now, 1)
	require.Equal(t, []string{"a1"}, topics, "the lowest Seq first, up to limit")
	bs, topics, _ := claim(now, 10)
	require.Equal(t, []string{"b1"}, topics, "one head per ordering key; a1 is claimed, and holds a2 back")
	_, topics, _ = claim(now, 10)
	require.Empty(t, topics, "every head is claimed")

	a1 := limited[0]
	require.NoError(t, b.Failed(ctx, a1), "given back unchanged")
	ms, topics, _ := claim(now, 10)
	require.Equal(t, []string{"a1"}, topics, "claimable again once given back")
	a1 = ms[0]
	a1.Failures, a1.LastError, a1.NextAttemptAt = 1, "boom", now.Add(time.Minute)
	require.NoError(t, b.Failed(ctx, a1))
	_, topics, next := claim(now, 10)
	require.Empty(t, topics, "a1 waits for its backoff and holds a2 back")
	require.True(t, next.Equal(now.Add(time.Minute)), "the next attempt is reported: %v", next)
	ms, topics, _ = claim(now.Add(time.Minute), 10)
	require.Equal(t, []string{"a1"}, topics)
	a1 = ms[0]

	b1 := bs[0]
	require.NoError(t, b.Delivered(ctx, b1))
	require.ErrorIs(t, b.Delivered(ctx, b1), ErrMessageNotFound)
	require.ErrorIs(t, b.Failed(ctx, b1), ErrMessageNotFound)

	a1.Dead, a1.DeadAt, a1.DeadLetterRetention = true, now, time.Hour
	require.NoError(t, b.Failed(ctx, a1))
	_, topics, _ = claim(now, 10)
	require.Equal(t, []string{"a2"}, topics, "a dead letter no longer holds its ordering key")
	var dead []*idemcore.Message
	require.NoError(t, b.Messages(ctx, func(m *idemcore.Message, err error) error {
		require.NoError(t, err)
		if m.Dead {
			dead = append(dead, m)
		}
		return nil
	}))
	require.Len(t, dead, 1)
	require.Equal(t, "boom", dead[0].LastError)
	require.Equal(t, time.Hour, dead[0].DeadLetterRetention)

	n, err := b.PruneDead(ctx, func(*idemcore.Message) bool { return false }, 1)
	require.NoError(t, err)
	require.Zero(t, n)
	n, err = b.PruneDead(ctx, func(*idemcore.Message) bool { return true }, 1)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.ErrorIs(t, b.DropDead(ctx, a1.Seq), ErrMessageNotFound)
}

// TestBoltClaimDueBySeq: ClaimDue's messages come by Seq, as the seam says,
// also when a head due again after its backoff is claimed beside a fresh one
// (the index keeps heads by next attempt).
func TestBoltClaimDueBySeq(t *testing.T) {
	e, err := OpenFile(filepath.Join(t.TempDir(), "idem.db"), &BoltOptions{NoSync: true}, &Options{PruneInterval: -1})
	require.NoError(t, err)
	defer e.Close()
	ctx := context.Background()
	enqueue := func(key string) {
		_, err := e.DoTx(ctx, key, nil, func(_ context.Context, tx *Tx) ([]byte, error) { return nil, tx.Enqueue("t", nil) })
		require.NoError(t, err)
	}
	now := e.c.Now()
	enqueue("x")
	due, err := e.b.ClaimDue(ctx, now, 10)
	require.NoError(t, err)
	require.Len(t, due.Messages, 1)
	x := due.Messages[0]
	x.Failures, x.NextAttemptAt = 1, now.Add(time.Minute)
	require.NoError(t, e.b.Failed(ctx, x))
	enqueue("y")
	due, err = e.b.ClaimDue(ctx, now.Add(2*time.Minute), 10)
	require.NoError(t, err)
	var keys []string
	for _, m := range due.Messages {
		keys = append(keys, m.Key)
	}
	require.Equal(t, []string{"x", "y"}, keys)
}
