package idem

import (
	"context"
	"errors"
	"log/slog"
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

// lapsingBackend is the bbolt backend with claims that lease for lease from
// a reading taken before the claim (as idempg's do), renewed only once an
// hour: within a test, a lease passes unrenewed, as a frozen owner's does.
// until is the last claim's lease end.
type lapsingBackend struct {
	idemcore.Backend[*Tx]
	lease time.Duration
	until time.Time
}

func (b *lapsingBackend) Info() idemcore.Info {
	i := b.Backend.Info()
	i.Heartbeat = time.Hour
	return i
}

func (b *lapsingBackend) Claim(ctx context.Context, req idemcore.ClaimRequest) (idemcore.ClaimResult, error) {
	before := time.Now()
	cr, err := b.Backend.Claim(ctx, req)
	if err == nil && cr.Claim != nil {
		cr.Claim.LeaseUntil = before.Add(b.lease)
		b.until = cr.Claim.LeaseUntil
	}
	return cr, err
}

// heldLog is a log handler whose warnings wait for release: the engine's
// background goroutines that log before they act (a timer's lapse) are held
// there, as a starved scheduler holds them. entered is sent to (without
// blocking) each time one is held.
type heldLog struct {
	entered chan struct{}
	release chan struct{}
}

func newHeldLog() *heldLog {
	return &heldLog{entered: make(chan struct{}, 1), release: make(chan struct{})}
}

func (h *heldLog) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h *heldLog) WithAttrs([]slog.Attr) slog.Handler           { return h }
func (h *heldLog) WithGroup(string) slog.Handler                { return h }
func (h *heldLog) Handle(context.Context, slog.Record) error {
	select {
	case h.entered <- struct{}{}:
	default:
	}
	<-h.release
	return nil
}

// fn's context reports its lease's end the moment it has passed, whichever
// goroutine runs first (issue 18, item 2): fn, resumed after its lease
// passed unrenewed, finds its context ended (cause ErrLeaseLost) on its
// first look, through Err, Done, Cause or a child it derives then, while
// every background goroutine of the engine's is held (a logger that blocks
// stands for a timer goroutine not yet scheduled). Its Deadline stays the
// caller's, its values are the caller's and the Call, and children derived
// before the lapse (WithCancel, AfterFunc) end with it.
func TestFnSeesLeaseEndWithoutTheTimer(t *testing.T) {
	for _, first := range []string{"Err", "Done", "Cause", "a child of WithCancel"} {
		t.Run(first, func(t *testing.T) {
			// A run in which the lease passed before fn's first look (a
			// loaded machine) shows nothing: it is tried again with a
			// longer lease.
			for lease := 20 * time.Millisecond; !lookAfterLease(t, first, lease); lease *= 2 {
				if lease > 5*time.Second {
					t.Fatal("fn never started within its lease")
				}
			}
		})
	}
}

// lookAfterLease runs a Do whose fn, started within a lease of lease, waits
// for it to pass and then looks at its context first through first; it
// checks what fn saw, and reports false if fn started after its lease
// passed.
func lookAfterLease(t *testing.T, first string, lease time.Duration) (inTime bool) {
	type ctxKey struct{}
	deadline := time.Now().Add(time.Hour)
	lb := &lapsingBackend{lease: lease}
	held := newHeldLog()
	e, err := open(filepath.Join(t.TempDir(), "idem.db"), nil, &Options{PruneInterval: -1, Logger: slog.New(held)},
		func(b idemcore.Backend[*Tx]) idemcore.Backend[*Tx] { lb.Backend = b; return lb })
	require.NoError(t, err)
	defer e.Close()
	ctx, cancel := context.WithDeadline(context.WithValue(context.Background(), ctxKey{}, "v"), deadline)
	defer cancel()
	var (
		sawEnd    bool
		cause     error
		early     context.Context // derived before the lapse
		endEarly  context.CancelFunc
		afterFunc = make(chan struct{})
	)
	_, err = e.Do(ctx, "k", nil, func(ctx context.Context) ([]byte, error) {
		defer close(held.release) // stop holds the heartbeat: let it go before fn returns
		if time.Until(lb.until) <= 0 {
			return nil, errors.New("fn started after its lease")
		}
		inTime = true
		if ctx.Err() != nil {
			return nil, errors.New("fn's context ended before its lease")
		}
		early, endEarly = context.WithCancel(ctx)
		context.AfterFunc(ctx, func() { close(afterFunc) })
		for time.Until(lb.until) > 0 { // the lease passes: no yield, no sleep
		}
		switch first {
		case "Err":
			sawEnd = ctx.Err() != nil
		case "Done":
			select {
			case <-ctx.Done():
				sawEnd = true
			default:
			}
		case "Cause":
			sawEnd = context.Cause(ctx) != nil
		case "a child of WithCancel":
			child, stop := context.WithCancel(ctx)
			sawEnd = child.Err() != nil
			stop()
		}
		cause = context.Cause(ctx)
		d, ok := ctx.Deadline()
		if !ok || !d.Equal(deadline) || ctx.Value(ctxKey{}) != "v" {
			t.Errorf("fn's context: deadline %v %v, value %v; want the caller's", d, ok, ctx.Value(ctxKey{}))
		}
		if c, ok := CallFrom(ctx); !ok || c.Key != "k" || c.Attempt != 1 {
			t.Errorf("CallFrom: %+v, %v", c, ok)
		}
		return nil, ctx.Err()
	})
	if !inTime {
		return false
	}
	require.True(t, sawEnd, "fn's first look after its lease passed (%s) found its context live", first)
	require.ErrorIs(t, cause, idemcore.ErrLeaseLost)
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, early.Err(), context.Canceled, "a child derived before the lapse ends with fn's context")
	require.ErrorIs(t, context.Cause(early), idemcore.ErrLeaseLost)
	endEarly()
	select {
	case <-afterFunc:
	case <-time.After(30 * time.Second): // a hang guard, not a timing claim
		t.Fatal("an AfterFunc of fn's context never ran")
	}
	r, err := e.Get("k")
	require.NoError(t, err)
	require.Equal(t, StateStarted, r.State, "an interruption: the record stays for recovery")
	return true
}

// A renewal moves the lease fn's context judges by: past the claim's first
// lease end, once renewed, fn's context is live. A run whose renewal came
// only after that end (a starved machine: the lease did lapse) is tried
// again with a longer lease.
func TestRenewalExtendsFnsLease(t *testing.T) {
	for lease := 100 * time.Millisecond; ; lease *= 2 {
		if lease > 10*time.Second {
			t.Fatal("no renewal came within the first lease in any try")
		}
		rb := &renewingBackend{lapsingBackend: lapsingBackend{lease: lease}}
		e, err := open(filepath.Join(t.TempDir(), "idem.db"), nil, &Options{PruneInterval: -1},
			func(b idemcore.Backend[*Tx]) idemcore.Backend[*Tx] { rb.Backend = b; return rb })
		require.NoError(t, err)
		var live, inTime bool
		_, err = e.Do(context.Background(), "k", nil, func(ctx context.Context) ([]byte, error) {
			for rb.renews.Load() < 2 { // the first renewal's lease is stored once the second begins
				if ctx.Err() != nil {
					return nil, nil
				}
				time.Sleep(time.Millisecond)
			}
			inTime = time.Until(rb.until) > 0
			for time.Until(rb.until) > 0 {
				time.Sleep(time.Until(rb.until))
			}
			live = ctx.Err() == nil
			return []byte("ok"), nil
		})
		require.NoError(t, err)
		require.NoError(t, e.Close())
		if !inTime {
			continue
		}
		require.True(t, live, "fn's context ended at the claim's first lease end, after a renewal moved it")
		return
	}
}

// renewingBackend is lapsingBackend with a heartbeat of a millisecond whose
// renewals give a lease of an hour.
type renewingBackend struct {
	lapsingBackend
	renews atomic.Int32
}

func (b *renewingBackend) Info() idemcore.Info {
	i := b.Backend.Info()
	i.Heartbeat = time.Millisecond
	return i
}

func (b *renewingBackend) Renew(ctx context.Context, c *idemcore.Claim) error {
	b.renews.Add(1)
	before := time.Now()
	if err := b.Backend.Renew(ctx, c); err != nil {
		return err
	}
	c.LeaseUntil = before.Add(time.Hour)
	return nil
}
