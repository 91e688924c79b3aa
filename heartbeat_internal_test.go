package idem

import (
	"context"
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/core"
)

// leasedBackend is the bbolt backend with claims that need renewal, as a
// Postgres backend's leases do: a heartbeat period, and a Renew that fails
// from its failAt-th call on.
type leasedBackend struct {
	core.Backend[*Tx]
	renews atomic.Int32
	failAt int32
}

func (b *leasedBackend) Info() core.Info {
	i := b.Backend.Info()
	i.Heartbeat = time.Millisecond
	return i
}

func (b *leasedBackend) Renew(ctx context.Context, c *core.Claim) error {
	if b.renews.Add(1) >= b.failAt {
		return errors.New("renewal refused")
	}
	return b.Backend.Renew(ctx, c)
}

// The core renews a claim while fn runs, and when a renewal fails it cancels
// fn's context with cause ErrLeaseLost (issue 11: the slot a Postgres lease
// drops into). fn's error then ends the call as an interruption: the started
// record stays, for recovery.
func TestHeartbeatFailureCancelsFnWithErrLeaseLost(t *testing.T) {
	lb := &leasedBackend{failAt: 3}
	e, err := open(filepath.Join(t.TempDir(), "idem.db"), &Options{PruneInterval: -1},
		func(b core.Backend[*Tx]) core.Backend[*Tx] { lb.Backend = b; return lb })
	require.NoError(t, err)
	defer e.Close()
	var cause error
	_, err = e.Do(context.Background(), "k", nil, func(ctx context.Context) ([]byte, error) {
		select {
		case <-ctx.Done():
		case <-time.After(30 * time.Second): // hang guard: the heartbeat never cancelled
			return nil, errors.New("fn's context was never cancelled")
		}
		cause = context.Cause(ctx)
		return nil, ctx.Err()
	})
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, cause, core.ErrLeaseLost)
	require.GreaterOrEqual(t, lb.renews.Load(), int32(3), "renewed until it failed")
	r, err := e.Get("k")
	require.NoError(t, err)
	require.Equal(t, StateStarted, r.State, "an interruption: the record stays for recovery")

	// A call whose fn returns before any renewal fails is untouched.
	lb.renews.Store(0)
	lb.failAt = 1 << 30
	res, err := e.Do(context.Background(), "k2", nil, func(ctx context.Context) ([]byte, error) {
		for lb.renews.Load() < 2 {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(time.Millisecond):
			}
		}
		return []byte("ok"), nil
	})
	require.NoError(t, err)
	require.Equal(t, "ok", string(res.Response))
}
