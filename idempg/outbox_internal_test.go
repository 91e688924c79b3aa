package idempg

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idempg/internal/pgtest"
)

// backends opens n backends (as n processes would) on one new schema, their
// database clock offset by *offset.
func backends(t *testing.T, n int, offset *atomic.Int64) []*backend {
	t.Helper()
	pool := pgtest.Pool(t, pgtest.Env)
	o := &Options{Schema: pgtest.Schema(t, pool), Lease: 2 * time.Second}
	SetClockOffset(o, func() time.Duration { return time.Duration(offset.Load()) })
	if _, err := Migrate(context.Background(), pool, o); err != nil {
		t.Fatal(err)
	}
	var bs []*backend
	for i := range n {
		s, err := resolve(o)
		if err != nil {
			t.Fatal(err)
		}
		s.Owner = fmt.Sprintf("process-%d", i)
		b, err := newBackend(context.Background(), pool, s, false)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		bs = append(bs, b)
	}
	return bs
}

// enqueue commits one DoTx call of key that enqueues a message per ordering
// key in order, and returns their seqs.
func enqueue(t *testing.T, b *backend, key string, orderingKeys ...string) []uint64 {
	t.Helper()
	var seqs []uint64
	now := time.Now()
	err := b.RunTx(context.Background(), &idemcore.Claim{Key: key}, func(tx pgx.Tx) (*idemcore.Record, error) {
		seqs = nil
		for _, ok := range orderingKeys {
			if err := EnqueueOrdered(tx, "topic", ok, []byte(key+"→"+ok)); err != nil {
				return nil, err
			}
			v, _ := txs.Load(tx)
			seqs = append(seqs, uint64(v.(*txState).next)) // index, replaced below
		}
		return &idemcore.Record{Key: key, State: idemcore.StateDone, Attempt: 1, StartedAt: now, CompletedAt: now, Retention: time.Hour}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The seqs, read back in enqueue order.
	rows, err := b.pool.Query(context.Background(), b.sql(`SELECT seq FROM {schema}.idem_outbox WHERE key = $1 ORDER BY seq`), key)
	if err != nil {
		t.Fatal(err)
	}
	all, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	seqs = seqs[:0]
	for _, s := range all {
		seqs = append(seqs, uint64(s))
	}
	return seqs
}

func sorted(s ...uint64) []uint64 { slices.Sort(s); return s }

func seqsOf(ms []*idemcore.Message) []uint64 {
	var s []uint64
	for _, m := range ms {
		s = append(s, m.Seq)
	}
	return s
}

// TestOutboxHeads: only the head of each ordering key is claimable, a
// claim is held for one lease against other dispatchers, a lapsed claim is
// claimed again, a dead letter is overtaken, and a retried dead letter
// takes its old place.
func TestOutboxHeads(t *testing.T) {
	var offset atomic.Int64
	bs := backends(t, 2, &offset)
	a, b := bs[0], bs[1]
	ctx := context.Background()
	o1 := enqueue(t, a, "call-1", "o1", "o2") // o1: m0, o2: n0
	o2 := enqueue(t, a, "call-2", "o1", "o2") // o1: m1, o2: n1
	m0, n0, m1, n1 := o1[0], o1[1], o2[0], o2[1]

	var got [2][]*idemcore.Message
	var wg sync.WaitGroup
	for i, d := range bs {
		wg.Go(func() {
			ms, err := claimDue(d, ctx, time.Now(), 10)
			if err != nil {
				t.Error(err)
			}
			got[i] = ms
		})
	}
	wg.Wait()
	claimed := append(seqsOf(got[0]), seqsOf(got[1])...)
	slices.Sort(claimed)
	if !slices.Equal(claimed, []uint64{m0, n0}) {
		t.Fatalf("two dispatchers at once claimed %v, want the heads %v once each", claimed, []uint64{m0, n0})
	}
	if ms, _ := claimDue(b, ctx, time.Now(), 10); len(ms) != 0 {
		t.Fatalf("claimed %v while the heads are held", seqsOf(ms))
	}
	// m0 delivered: m1 is the head of o1; n0 is still held.
	if err := a.Delivered(ctx, &idemcore.Message{Seq: m0}); err != nil {
		t.Fatal(err)
	}
	ms, err := claimDue(b, ctx, time.Now(), 10)
	if err != nil || !slices.Equal(seqsOf(ms), []uint64{m1}) {
		t.Fatalf("after m0's delivery: %v, %v; want m1", seqsOf(ms), err)
	}
	// The dispatcher holding n0 dies: past its lease, n0 is claimed again.
	offset.Add(int64(3 * time.Second))
	ms, err = claimDue(b, ctx, time.Now(), 10)
	if err != nil || !slices.Equal(seqsOf(ms), sorted(m1, n0)) {
		t.Fatalf("after the claims lapsed: %v, %v; want m1 and n0 again", seqsOf(ms), err)
	}
	// n0 dies: n1 overtakes it. (Failed is given the message its ClaimDue
	// returned, as the dispatcher does: its claim is known by it.)
	dead := withSeq(ms, n0)
	dead.Failures, dead.LastError, dead.Dead, dead.DeadAt, dead.DeadLetterRetention = 5, "no", true, time.Now(), time.Hour
	if err := b.Failed(ctx, dead); err != nil {
		t.Fatal(err)
	}
	ms, err = claimDue(a, ctx, time.Now(), 10)
	if err != nil || !slices.Equal(seqsOf(ms), []uint64{n1}) {
		t.Fatalf("after n0 died: %v, %v; want n1", seqsOf(ms), err)
	}
	// Retried, n0 is o2's head again once n1's claim lapses.
	if err := a.RetryDead(ctx, n0, func(m *idemcore.Message) error { m.Failures = 0; return nil }); err != nil {
		t.Fatal(err)
	}
	offset.Add(int64(3 * time.Second))
	ms, err = claimDue(a, ctx, time.Now(), 10)
	if err != nil || !slices.Equal(seqsOf(ms), sorted(m1, n0)) {
		t.Fatalf("after n0's retry: %v, %v; want m1 and n0 (before n1)", seqsOf(ms), err)
	}
	// A failed attempt waits for its next attempt time, by the database's
	// clock (the now ClaimDue is given is not read).
	now, err := a.Clock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	later := now.Add(time.Hour)
	failed := withSeq(ms, m1)
	failed.Failures, failed.LastError, failed.NextAttemptAt = 1, "later", later
	if err := a.Failed(ctx, failed); err != nil {
		t.Fatal(err)
	}
	if ms, _ := claimDue(b, ctx, later, 10); len(ms) != 0 {
		t.Fatalf("claimed %v before m1's next attempt", seqsOf(ms))
	}
	offset.Add(int64(time.Hour))
	if ms, _ := claimDue(b, ctx, time.Now(), 10); !slices.Equal(seqsOf(ms), sorted(m1, n0)) {
		t.Fatalf("at m1's next attempt (n0's claim lapsed by then): %v", seqsOf(ms))
	}
}

// TestOutboxDrainedByProcesses: three dispatchers drain 120 messages of 6
// ordering keys at once: every message is delivered, and each ordering key's
// deliveries come in enqueue order.
func TestOutboxDrainedByProcesses(t *testing.T) {
	var offset atomic.Int64
	bs := backends(t, 3, &offset)
	ctx := context.Background()
	keys := []string{"a", "b", "c", "d", "e", "f"}
	var want []uint64
	for i := range 20 {
		want = append(want, enqueue(t, bs[0], fmt.Sprintf("call-%d", i), keys...)...)
	}
	var (
		mu        sync.Mutex
		delivered = map[string][]uint64{}
		count     atomic.Int32
	)
	var wg sync.WaitGroup
	for _, d := range bs {
		for range 2 {
			wg.Go(func() {
				for count.Load() < int32(len(want)) {
					ms, err := claimDue(d, ctx, time.Now(), 4)
					if err != nil {
						t.Error(err)
						return
					}
					for _, m := range ms {
						mu.Lock()
						delivered[m.OrderingKey] = append(delivered[m.OrderingKey], m.Seq)
						mu.Unlock()
						if err := d.Delivered(ctx, m); err != nil {
							t.Error(err)
							return
						}
						count.Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	var all []uint64
	for k, seqs := range delivered {
		if !slices.IsSorted(seqs) {
			t.Errorf("ordering key %s delivered out of order: %v", k, seqs)
		}
		all = append(all, seqs...)
	}
	slices.Sort(all)
	slices.Sort(want)
	if !slices.Equal(all, want) {
		t.Fatalf("delivered %d messages, want each of %d once", len(all), len(want))
	}
}

// TestPruneBounded: Prune deletes expired records in batches of at most
// Limit and leaves live ones and the kept-until-resolved ones.
func TestPruneBounded(t *testing.T) {
	var offset atomic.Int64
	b := backends(t, 1, &offset)[0]
	ctx := context.Background()
	t0 := time.Unix(1_800_000_000, 0)
	put := func(key string, st idemcore.State, at time.Time, kept bool) {
		t.Helper()
		rec := &idemcore.Record{Key: key, State: st, Attempt: 1, StartedAt: at, Retention: time.Hour, KeptUntilResolved: kept}
		if st == idemcore.StateDone {
			rec.CompletedAt = at
		}
		if err := b.Resolve(ctx, key, func(*idemcore.Record) (*idemcore.Record, error) { return rec, nil }); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 7 {
		put(fmt.Sprintf("old-%d", i), idemcore.StateDone, t0, false)
	}
	put("old-started", idemcore.StateStarted, t0, false)
	put("kept", idemcore.StateStarted, t0, true)
	put("young", idemcore.StateDone, t0.Add(90*time.Minute), false)
	res, err := b.Prune(ctx, idemcore.PruneRequest{Now: t0.Add(2 * time.Hour), Retention: time.Hour, Limit: 3})
	if err != nil {
		t.Fatal(err)
	}
	if res.Deleted != 8 || res.Interrupted != 1 {
		t.Fatalf("pruned %+v, want 8 deleted, 1 of them started", res)
	}
	var left []string
	if err := b.Scan(ctx, func(r *idemcore.Record, err error) error { left = append(left, r.Key); return err }); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(left, []string{"kept", "young"}) {
		t.Fatalf("left %v", left)
	}
	// A longer window of the engine keeps a record its writer's would drop.
	res, err = b.Prune(ctx, idemcore.PruneRequest{Now: t0.Add(150 * time.Minute), Retention: 2 * time.Hour, Limit: 3})
	if err != nil || res.Deleted != 0 {
		t.Fatalf("prune with a longer window: %+v, %v; want nothing", res, err)
	}
}

// claimDue is b.ClaimDue's messages.
// withSeq returns the message of ms with seq, or a message of that seq
// alone if ms has none.
func withSeq(ms []*idemcore.Message, seq uint64) *idemcore.Message {
	for _, m := range ms {
		if m.Seq == seq {
			return m
		}
	}
	return &idemcore.Message{Seq: seq}
}

func claimDue(b *backend, ctx context.Context, now time.Time, limit int) ([]*idemcore.Message, error) {
	due, err := b.ClaimDue(ctx, now, limit)
	return due.Messages, err
}

// TestOutboxFailedIsFenced: a dispatcher's Failed for a claim that lapsed
// and was taken since, by another dispatcher or by its own, writes nothing
// and says the message is not found (its claim is not this one any more);
// the current claim's Failed writes.
func TestOutboxFailedIsFenced(t *testing.T) {
	var offset atomic.Int64
	bs := backends(t, 2, &offset)
	a, b := bs[0], bs[1]
	ctx := context.Background()
	seq := enqueue(t, a, "call-1", "o1")[0]
	ms, err := claimDue(a, ctx, time.Now(), 10)
	if err != nil || !slices.Equal(seqsOf(ms), []uint64{seq}) {
		t.Fatalf("a's claim: %v, %v", seqsOf(ms), err)
	}
	late := ms[0]
	offset.Add(int64(3 * time.Second)) // a's claim lapses
	if ms, err := claimDue(b, ctx, time.Now(), 10); err != nil || !slices.Equal(seqsOf(ms), []uint64{seq}) {
		t.Fatalf("b's claim after a's lapsed: %v, %v", seqsOf(ms), err)
	}
	late.Failures, late.LastError, late.Dead, late.DeadAt, late.DeadLetterRetention = 1, "late", true, time.Now(), time.Hour
	if err := a.Failed(ctx, late); !errors.Is(err, idemcore.ErrMessageNotFound) {
		t.Fatalf("a's late Failed of a message b holds: %v, want ErrMessageNotFound", err)
	}
	var dead bool
	if err := a.Messages(ctx, func(m *idemcore.Message, err error) error { dead = dead || m.Dead; return err }); err != nil || dead {
		t.Fatalf("after a's late Failed: dead %v, %v; want the message pending, b's", dead, err)
	}
	if ms, _ := claimDue(a, ctx, time.Now(), 10); len(ms) != 0 {
		t.Fatalf("a's late Failed gave b's claim up: a claimed %v", seqsOf(ms))
	}

	offset.Add(int64(3 * time.Second)) // b's claim lapses; a claims it again
	ms, err = claimDue(a, ctx, time.Now(), 10)
	if err != nil || len(ms) != 1 {
		t.Fatalf("a's second claim: %v, %v", seqsOf(ms), err)
	}
	late.Dead = false
	if err := a.Failed(ctx, late); !errors.Is(err, idemcore.ErrMessageNotFound) {
		t.Fatalf("Failed of a's first claim after its second: %v, want ErrMessageNotFound", err)
	}
	ms[0].Failures, ms[0].LastError = 1, "now"
	if err := a.Failed(ctx, ms[0]); err != nil {
		t.Fatalf("Failed of a's current claim: %v", err)
	}
}

// TestOutboxClaimLease: ClaimDue stamps its claims' end from a local reading
// taken before the statement (never later than the claim's end by the
// database's clock, so a handler's context ends no later than its claim);
// RenewClaim moves it on, and refuses (ErrFenced) a claim that lapsed and
// was taken by another dispatcher, which alone renews it then.
func TestOutboxClaimLease(t *testing.T) {
	var offset atomic.Int64
	bs := backends(t, 2, &offset)
	a, b := bs[0], bs[1]
	ctx := context.Background()
	enqueue(t, a, "call-1", "o1")
	before := time.Now()
	due, err := a.ClaimDue(ctx, time.Now(), 10)
	after := time.Now()
	if err != nil || len(due.Messages) != 1 {
		t.Fatalf("claim: %+v, %v", due, err)
	}
	lease := a.s.Lease
	if due.ClaimUntil.Before(before.Add(lease-time.Second)) || due.ClaimUntil.After(after.Add(lease)) || due.ClaimUntil == due.ClaimUntil.Round(0) {
		t.Fatalf("ClaimUntil %v, want about a lease (%v) after the claim, with a monotonic reading", due.ClaimUntil, lease)
	}
	m := due.Messages[0]
	until, err := a.RenewClaim(ctx, m)
	if err != nil || !until.After(due.ClaimUntil) || until.After(time.Now().Add(lease)) {
		t.Fatalf("renewal: %v, %v; want a later end, at most a lease from now", until, err)
	}
	offset.Add(int64(lease + time.Second)) // a's claim lapses by the database's clock
	if _, err := a.RenewClaim(ctx, m); !errors.Is(err, idemcore.ErrFenced) {
		t.Fatalf("renewing a lapsed claim: %v, want ErrFenced", err)
	}
	taken, err := b.ClaimDue(ctx, time.Now(), 10)
	if err != nil || len(taken.Messages) != 1 {
		t.Fatalf("b's claim of the lapsed one: %+v, %v", taken, err)
	}
	if _, err := a.RenewClaim(ctx, m); !errors.Is(err, idemcore.ErrFenced) {
		t.Fatalf("renewing a claim b took: %v, want ErrFenced", err)
	}
	if _, err := b.RenewClaim(ctx, taken.Messages[0]); err != nil {
		t.Fatalf("b renewing its claim: %v", err)
	}
	if empty, err := a.ClaimDue(ctx, time.Now(), 10); err != nil || len(empty.Messages) != 0 || !empty.ClaimUntil.IsZero() {
		t.Fatalf("nothing due: %+v, %v; want no messages and no lease", empty, err)
	}
}
