package idemtest

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/internal/testkit"
)

// logs holds DESIGN.md's rule that keys and responses are user data: the
// engine's log (every level) never carries them, on the paths that log
// (recovery, pruning, outbox failures and panics).
func (s *suite[T]) logs(t *testing.T) {
	const key, resp, payload = "secret-key-4242", "secret-resp-9191", "secret-payload-7373"
	var out testkit.SyncBuffer
	c := newClock()
	var failed sync.Once
	handler := func(ctx context.Context, m idemcore.Message) error {
		var err error
		failed.Do(func() { err = errors.New("gateway down") })
		if err != nil {
			return err
		}
		panic("handler panics: " + payload)
	}
	opts := outboxOptions(c, map[string]idemcore.Handler{"charge": handler},
		idemcore.OutboxOptions{BaseBackoff: time.Second, MaxBackoff: time.Second, MaxAttempts: 3})
	opts.Retention = time.Hour
	opts.Logger = slog.New(slog.NewJSONHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e, _ := s.fresh(t, opts)

	s.interrupt(t, e, key)
	_, err := e.Do(bg, key, fp, func(context.Context) ([]byte, error) { return []byte(resp), nil })
	require.NoError(t, err, "a recovery, which the engine logs")
	_, err = e.Do(bg, key+"-failed", fp, func(context.Context) ([]byte, error) { return []byte(resp), errors.New(resp) })
	require.Error(t, err)
	_, err = e.DoTx(bg, key+"-outbox", fp, func(ctx context.Context, tx T) ([]byte, error) {
		return []byte(resp), s.h.Enqueue(tx, "charge", []byte(payload))
	})
	require.NoError(t, err)
	testkit.Eventually(t, "a dead letter", func() { c.Advance(time.Minute) }, func() bool {
		ms := messages(t, e)
		return len(ms) == 1 && ms[0].Dead
	})
	c.Advance(3 * time.Hour)
	n, err := e.Prune(bg)
	require.NoError(t, err)
	require.Positive(t, n)
	require.NoError(t, e.Close())

	logged := out.String()
	require.NotEmpty(t, logged, "the engine logs its own events (recovery, pruning, handler failures): Options.Logger must reach it")
	for _, secret := range []string{"secret-key", "secret-resp", "secret-payload"} {
		require.NotContains(t, logged, secret, "user data in the engine's log")
	}
}
