package idem

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/core"
)

// The outbox operations of the bbolt backend that the root's own dispatcher
// does not use (it keeps its in-memory queues): ClaimDue returns only the
// due head of each ordering key, Delivered and Failed move a message on, and
// PruneDead deletes in bounded batches.
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
	heads := func(now time.Time) []string {
		ms, err := b.ClaimDue(ctx, now, 10)
		require.NoError(t, err)
		var topics []string
		for _, m := range ms {
			topics = append(topics, m.Topic)
		}
		return topics
	}
	now := e.now()
	require.Equal(t, []string{"a1", "b1"}, heads(now), "one head per ordering key, by Seq")
	limited, err := b.ClaimDue(ctx, now, 1)
	require.NoError(t, err)
	require.Len(t, limited, 1)

	ms, err := b.ClaimDue(ctx, now, 10)
	require.NoError(t, err)
	a1, b1 := ms[0], ms[1]
	a1.Failures, a1.LastError, a1.NextAttemptAt = 1, "boom", now.Add(time.Minute)
	require.NoError(t, b.Failed(ctx, a1))
	require.Equal(t, []string{"b1"}, heads(now), "a1 waits for its backoff and holds a2 back")
	require.Equal(t, []string{"a1", "b1"}, heads(now.Add(time.Minute)))

	require.NoError(t, b.Delivered(ctx, b1))
	require.ErrorIs(t, b.Delivered(ctx, b1), ErrMessageNotFound)
	require.ErrorIs(t, b.Failed(ctx, b1), ErrMessageNotFound)

	a1.Dead, a1.DeadAt, a1.DeadLetterRetention = true, now, time.Hour
	require.NoError(t, b.Failed(ctx, a1))
	require.Equal(t, []string{"a2"}, heads(now), "a dead letter no longer holds its ordering key")
	var dead []*core.Message
	require.NoError(t, b.Messages(ctx, func(m *core.Message, err error) error {
		require.NoError(t, err)
		if m.Dead {
			dead = append(dead, m)
		}
		return nil
	}))
	require.Len(t, dead, 1)
	require.Equal(t, "boom", dead[0].LastError)
	require.Equal(t, time.Hour, dead[0].DeadLetterRetention)

	n, err := b.PruneDead(ctx, func(*core.Message) bool { return false }, 1)
	require.NoError(t, err)
	require.Zero(t, n)
	n, err = b.PruneDead(ctx, func(*core.Message) bool { return true }, 1)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.ErrorIs(t, b.DropDead(ctx, a1.Seq), ErrMessageNotFound)
}
