package idemcore_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/internal/memstore"
	"github.com/idemkit/idem/internal/testkit"
)

// claimFirst is a memstore backend that claims first, as Postgres does
// (Info.ClaimFirst): a Claim of a key with a live record writes nothing and
// answers it; one whose record is outside its window replaces it. RunTx's
// claim of a free key (Token zero) fails with ErrClaimTaken on a live
// record, before fn runs, as Postgres's in its transaction. It counts the
// Lookups the engine makes.
type claimFirst struct {
	idemcore.Backend[*memstore.Tx]
	now     func() time.Time // the store's clock (nil: the latest claim's start, else time.Now)
	lookups atomic.Int64
	latest  atomic.Int64 // the latest StartedAt of a Claim, Unix ns
}

func (b *claimFirst) Info() idemcore.Info {
	info := b.Backend.Info()
	info.ClaimFirst = true
	return info
}

func (b *claimFirst) Lookup(ctx context.Context, q idemcore.Lookup) (*idemcore.Record, time.Time, error) {
	b.lookups.Add(1)
	return b.Backend.Lookup(ctx, q)
}

func (b *claimFirst) Claim(ctx context.Context, req idemcore.ClaimRequest) (idemcore.ClaimResult, error) {
	for t := req.Started.StartedAt.UnixNano(); ; {
		if old := b.latest.Load(); old >= t || b.latest.CompareAndSwap(old, t) {
			break
		}
	}
	if req.Prev == nil {
		cur, _, err := b.Backend.Lookup(ctx, idemcore.Lookup{Key: req.Started.Key})
		if err != nil {
			return idemcore.ClaimResult{}, err
		}
		if cur != nil && !expired(cur, req.Started) {
			return idemcore.ClaimResult{Status: idemcore.ClaimChanged, Current: cur}, nil
		}
	}
	return b.Backend.Claim(ctx, req)
}

func (b *claimFirst) RunTx(ctx context.Context, c *idemcore.Claim, fn func(*memstore.Tx) (*idemcore.Record, error)) error {
	if c.Token == 0 {
		cur, _, err := b.Backend.Lookup(ctx, idemcore.Lookup{Key: c.Key})
		if err != nil {
			return err
		}
		now := time.Now()
		switch l := b.latest.Load(); {
		case b.now != nil:
			now = b.now()
		case l != 0:
			now = time.Unix(0, l) // the seam suite's fixed times
		}
		if cur != nil && !expired(cur, &idemcore.Record{StartedAt: now}) {
			return idemcore.ErrClaimTaken
		}
	}
	return b.Backend.RunTx(ctx, c, fn)
}

// expired is Postgres's rule (idempg's expiredSQL) for one process: r is
// outside the longer of its window and the claim's at the claim's start,
// and not a started record kept until resolved.
func expired(r, claim *idemcore.Record) bool {
	if r.State == idemcore.StateStarted && r.KeptUntilResolved {
		return false
	}
	end := r.StartedAt
	if r.State == idemcore.StateDone {
		end = r.CompletedAt
	}
	return !end.Add(max(r.Retention, claim.Retention)).After(claim.StartedAt)
}

// uncached is an engine over b with no pruner and no replay cache: every
// replay reads b, as on Postgres.
func uncached(t *testing.T, b idemcore.Backend[*memstore.Tx]) *idemcore.Engine[*memstore.Tx] {
	t.Helper()
	e, err := idemcore.New(b, idemcore.Options{PruneInterval: -1, ReplayCacheBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// echoDoTx is a DoTx call of e whose fn answers its key and counts its
// runs in runs; it fails the test unless the call answers its key.
func echoDoTx(t *testing.T, e *idemcore.Engine[*memstore.Tx], runs *int) func(key string) idemcore.Result {
	return func(key string) idemcore.Result {
		t.Helper()
		res, err := e.DoTx(context.Background(), key, nil, func(_ context.Context, tx *memstore.Tx) ([]byte, error) {
			*runs++
			return []byte(key), nil
		})
		if err != nil || string(res.Response) != key {
			t.Fatalf("DoTx %s: %q, %v", key, res.Response, err)
		}
		return res
	}
}

// TestConformanceClaimFirst runs the conformance suite with Do claiming
// first: every outcome holds when the claim, not a Lookup, reads the key.
func TestConformanceClaimFirst(t *testing.T) {
	if !testkit.Failpoints(t) {
		return
	}
	h := memHarness
	h.OpenWrapped = func(t testing.TB, store string, o idemtest.Options, wrap func(idemcore.Backend[*memstore.Tx]) idemcore.Backend[*memstore.Tx]) (idemtest.Engine[*memstore.Tx], error) {
		return memOpen(t, store, o, func(b idemcore.Backend[*memstore.Tx]) idemcore.Backend[*memstore.Tx] {
			var cf idemcore.Backend[*memstore.Tx] = &claimFirst{Backend: b, now: o.Now}
			if wrap != nil {
				cf = wrap(cf)
			}
			return cf
		})
	}
	h.Open = func(t testing.TB, store string, o idemtest.Options) (idemtest.Engine[*memstore.Tx], error) {
		return h.OpenWrapped(t, store, o, nil)
	}
	idemtest.Run(t, h)
}

func TestBackendClaimFirst(t *testing.T) {
	idemtest.RunBackend(t, func(t testing.TB) idemcore.Backend[*memstore.Tx] {
		return &claimFirst{Backend: memBackend(t)}
	})
}

// TestClaimFirstFollowsTheTraffic: on a backend that claims first, Do
// claims fresh keys without a Lookup; a run of replays turns it to looking
// up first (a replay by Lookup is cheaper than one by claim), and fresh
// keys turn it back. Every answer is right on either path.
func TestClaimFirstFollowsTheTraffic(t *testing.T) {
	b := &claimFirst{Backend: memBackend(t)}
	e := uncached(t, b)
	var runs int
	do := func(key string) idemcore.Result {
		t.Helper()
		res, err := e.Do(context.Background(), key, nil, func(context.Context) ([]byte, error) {
			runs++
			return []byte(key), nil
		})
		if err != nil || string(res.Response) != key {
			t.Fatalf("Do %s: %q, %v", key, res.Response, err)
		}
		return res
	}
	for i := range 100 {
		do(fmt.Sprint("fresh", i))
	}
	if n := b.lookups.Load(); n != 0 {
		t.Errorf("%d Lookups for 100 fresh keys; want none: the claim reads", n)
	}
	for i := range 100 {
		if !do(fmt.Sprint("fresh", i)).Replayed {
			t.Fatalf("fresh%d ran again", i)
		}
	}
	replayLookups := b.lookups.Load()
	if replayLookups < 50 {
		t.Errorf("%d Lookups for 100 replays; want most replays looked up once the traffic is replays", replayLookups)
	}
	for i := range 100 {
		do(fmt.Sprint("new", i))
	}
	if n := b.lookups.Load() - replayLookups; n > 32 {
		t.Errorf("%d Lookups for 100 fresh keys after the replays; want the first few only (the average's window is 32 calls): fresh traffic claims first again", n)
	}
	if runs != 200 {
		t.Errorf("fn ran %d times, want 200 (once per key)", runs)
	}
}

// TestDoTxClaimsFirst: on a backend that claims first, DoTx's fresh keys
// are claimed inside RunTx with no Lookup before; a key with a record
// (RunTx's ErrClaimTaken) is looked up then, and replayed without fn.
func TestDoTxClaimsFirst(t *testing.T) {
	b := &claimFirst{Backend: memBackend(t)}
	e := uncached(t, b)
	var runs int
	dotx := echoDoTx(t, e, &runs)
	for i := range 20 {
		dotx(fmt.Sprint("fresh", i))
	}
	if n := b.lookups.Load(); n != 0 {
		t.Errorf("%d Lookups for 20 fresh keys; want none: RunTx claims", n)
	}
	if !dotx("fresh3").Replayed {
		t.Error("a stored key ran again")
	}
	if n := b.lookups.Load(); n != 1 {
		t.Errorf("%d Lookups for a replay claimed first; want 1 (after RunTx's ErrClaimTaken)", n)
	}
	if runs != 20 {
		t.Errorf("fn ran %d times, want 20 (once per key)", runs)
	}
}

// runTxCounter counts the claims RunTx is asked to make (Token zero) that
// it refuses with ErrClaimTaken: DoTx calls that claimed first a key with
// a record.
type runTxCounter struct {
	*claimFirst
	taken atomic.Int64
}

func (b *runTxCounter) RunTx(ctx context.Context, c *idemcore.Claim, fn func(*memstore.Tx) (*idemcore.Record, error)) error {
	err := b.claimFirst.RunTx(ctx, c, fn)
	if c.Token == 0 && err == idemcore.ErrClaimTaken {
		b.taken.Add(1)
	}
	return err
}

// TestDoTxClaimFirstFollowsTheTraffic: DoTx's calls feed foundRate as Do's
// do (canClaimFirst): a run of DoTx replays turns DoTx to looking up first,
// instead of a claim in a transaction refused (ErrClaimTaken), rolled back
// and followed by the Lookup anyway for every replay.
func TestDoTxClaimFirstFollowsTheTraffic(t *testing.T) {
	b := &runTxCounter{claimFirst: &claimFirst{Backend: memBackend(t)}}
	e := uncached(t, b)
	var runs int
	dotx := echoDoTx(t, e, &runs)
	for i := range 100 {
		dotx(fmt.Sprint("fresh", i))
	}
	for i := range 100 {
		if !dotx(fmt.Sprint("fresh", i)).Replayed {
			t.Fatalf("fresh%d ran again", i)
		}
	}
	if n := b.taken.Load(); n > 50 {
		t.Errorf("%d of 100 DoTx replays claimed first (ErrClaimTaken); want most looked up first once the traffic is replays", n)
	}
	if runs != 100 {
		t.Errorf("fn ran %d times, want 100 (once per key)", runs)
	}
}
