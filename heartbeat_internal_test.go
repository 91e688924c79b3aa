package idem

import (
	"context"
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemcore"
)

// leasedBackend is the bbolt backend with claims that need renewal, as a
// Postgres backend's leases do: a heartbeat period, and a Renew that fails
// from its failAt-th call on.
type leasedBackend struct {
	idemcore.Backend[*Tx]
	renews atomic.Int32
	failAt int32
}

func (b *leasedBackend) Info() idemcore.Info {
	i := b.Backend.Info()
	i.Heartbeat = time.Millisecond
	return i
}

func (b *leasedBackend) Renew(ctx context.Context, c *idemcore.Claim) error {
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
	e, err := open(filepath.Join(t.TempDir(), "idem.db"), nil, &Options{PruneInterval: -1},
		func(b idemcore.Backend[*Tx]) idemcore.Backend[*Tx] { lb.Backend = b; return lb })
	require.NoError(t, err)
	defer e.Close()
	cause, err := doUntilCancelled(e)
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, cause, idemcore.ErrLeaseLost)
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

// hangingBackend is the bbolt backend with leased claims whose renewals
// hang (as on a starved pool or a blackholed connection) until their
// context ends: Claim stamps a lease of 100ms from a reading taken before
// it, as a Postgres backend does.
type hangingBackend struct {
	idemcore.Backend[*Tx]
	renews atomic.Int32
}

func (b *hangingBackend) Info() idemcore.Info {
	i := b.Backend.Info()
	i.Heartbeat = 10 * time.Millisecond
	return i
}

func (b *hangingBackend) Claim(ctx context.Context, req idemcore.ClaimRequest) (idemcore.ClaimResult, error) {
	before := time.Now()
	cr, err := b.Backend.Claim(ctx, req)
	if err == nil && cr.Claim != nil {
		cr.Claim.LeaseUntil = before.Add(100 * time.Millisecond)
	}
	return cr, err
}

func (b *hangingBackend) Renew(ctx context.Context, c *idemcore.Claim) error {
	b.renews.Add(1)
	<-ctx.Done()
	return ctx.Err()
}

// A renewal that hangs does not keep fn's context alive past the lease: the
// heartbeat gives each Renew a deadline at the claim's LeaseUntil and
// cancels fn's context then with cause ErrLeaseLost (trial finding 1).
func TestHangingRenewalCancelsFnAtLeaseEnd(t *testing.T) {
	hb := &hangingBackend{}
	e, err := open(filepath.Join(t.TempDir(), "idem.db"), nil, &Options{PruneInterval: -1},
		func(b idemcore.Backend[*Tx]) idemcore.Backend[*Tx] { hb.Backend = b; return hb })
	require.NoError(t, err)
	defer e.Close()
	cause, err := doUntilCancelled(e)
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, cause, idemcore.ErrLeaseLost)
	require.Equal(t, int32(1), hb.renews.Load(), "one renewal, which hung until the lease's end")
}

// doUntilCancelled runs a Do on "k" whose fn waits for its context's end
// (30 s at most, a hang guard) and returns the context's cause and Do's
// error.
func doUntilCancelled(e *Engine) (cause error, err error) {
	_, err = e.Do(context.Background(), "k", nil, func(ctx context.Context) ([]byte, error) {
		select {
		case <-ctx.Done():
		case <-time.After(30 * time.Second): // hang guard: the heartbeat never cancelled
			return nil, errors.New("fn's context was never cancelled")
		}
		cause = context.Cause(ctx)
		return nil, ctx.Err()
	})
	return cause, err
}
