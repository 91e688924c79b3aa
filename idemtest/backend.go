package idemtest

// The seam suite: the backend's contract (idemcore.Backend) as the core
// relies on it, driven directly, without an engine, the way River's
// riverdrivertest.Exercise drives a driver.

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemcore"
)

// RunBackend runs the seam suite on the Backend open returns, as subtests of
// t: lookups, claims and their fencing tokens, completion, release, DoTx's
// transaction, Forget, Resolve, Prune and Scan, then the outbox (enqueue in
// RunTx, claims of due heads, delivery, backoff, dead letters and their
// retry, drop and pruning) and waiting. open returns a Backend over a new,
// empty store of its own and releases it when t ends (the suite never calls
// Close: a backend under an engine, as OpenWrapped hands it, is the
// engine's to close).
//
// The suite holds each backend to what the core relies on, whatever its
// storage: the times it passes are a reading of Info.Clock when the backend
// has one (its own stamps are then not compared), else a fixed time, compared
// exactly. Cases that only a store shared by processes must keep (a stale
// claim's Complete refused with ErrFenced, a Claim that expected another
// version answered ClaimChanged) run when Info.Shared.
func RunBackend[T any](t *testing.T, open func(t testing.TB) idemcore.Backend[T]) {
	fresh := func(t *testing.T) (idemcore.Backend[T], *seam[T]) {
		t.Helper()
		b := open(t)
		s := &seam[T]{t: t, b: b, info: b.Info(), now: start}
		if s.info.Clock != nil {
			now, err := s.info.Clock(bg)
			require.NoError(t, err, "Info.Clock")
			s.now = now
		}
		require.NoError(t, b.Guard(), "Guard of a fresh backend")
		return b, s
	}

	t.Run("info names the backend", func(t *testing.T) {
		_, s := fresh(t)
		require.NotEmpty(t, s.info.Name)
	})

	t.Run("lookup of a missing key: nil, no error", func(t *testing.T) {
		_, s := fresh(t)
		require.Nil(t, s.lookup("missing"))
	})

	t.Run("claim, lookup, complete, lookup", func(t *testing.T) {
		b, s := fresh(t)
		c := s.claim("k", 1, nil)
		require.Equal(t, "k", c.Key)
		require.Equal(t, uint64(42), c.Fingerprint)
		require.NotZero(t, c.Token, "a claim of Claim has a fencing token")
		r := s.lookup("k")
		require.NotNil(t, r, "the started record is stored before fn runs")
		require.Equal(t, idemcore.StateStarted, r.State)
		require.Equal(t, uint64(42), r.Fingerprint)
		require.Equal(t, 1, r.Attempt)
		s.sameTime(s.now, r.StartedAt, "StartedAt")
		require.False(t, b.Holding(), "Holding outside a RunTx fn")

		require.NoError(t, b.Renew(bg, c), "Renew of a live claim")
		if s.info.Heartbeat > 0 {
			require.False(t, c.LeaseUntil.IsZero(), "a backend with a heartbeat sets LeaseUntil")
		}
		done := s.done(c.Started, []byte("resp"), nil)
		require.NoError(t, b.Complete(bg, c, done))
		r = s.isDone("k", "resp")
		require.Nil(t, r.Err)
		s.sameTime(done.CompletedAt, r.CompletedAt, "CompletedAt")
	})

	t.Run("responses and errors are stored as given: nil and empty differ", func(t *testing.T) {
		b, s := fresh(t)
		for key, resp := range map[string][]byte{"nil": nil, "empty": {}, "bytes": {0, 1, 0xff}} {
			c := s.claim(key, 1, nil)
			require.NoError(t, b.Complete(bg, c, s.done(c.Started, resp, nil)))
			r := s.lookup(key)
			require.Equal(t, resp == nil, r.Response == nil, "%s: nil stays nil, empty stays empty", key)
			require.Equal(t, string(resp), string(r.Response), key)
		}
		c := s.claim("err", 1, nil)
		require.NoError(t, b.Complete(bg, c, s.done(c.Started, nil, &idemcore.Error{Code: "card_declined", Message: "no \x00 funds"})))
		r := s.lookup("err")
		require.NotNil(t, r.Err)
		require.Equal(t, "card_declined", r.Err.Code)
		require.Equal(t, "no \x00 funds", r.Err.Message)
	})

	t.Run("a takeover gets a greater fencing token", func(t *testing.T) {
		b, s := fresh(t)
		c1 := s.claim("k", 1, nil)
		require.NoError(t, b.Release(bg, c1, c1.Started), "end c1's lease, keep its record")
		prev := s.lookup("k")
		require.Equal(t, idemcore.StateStarted, prev.State, "a released claim's record stays an interrupted execution")
		own, err := b.Owner(bg, prev)
		require.NoError(t, err)
		require.False(t, own.Owned, "a released claim's record is an orphan")
		c2 := s.claim("k", 2, prev)
		require.Greater(t, c2.Token, c1.Token)
		require.Equal(t, 2, s.lookup("k").Attempt)
		if s.info.Shared {
			err := b.Complete(bg, c1, s.done(c1.Started, []byte("stale"), nil))
			require.ErrorIs(t, err, idemcore.ErrFenced, "the stale claim's Complete")
			require.Equal(t, idemcore.StateStarted, s.lookup("k").State, "the stale claim wrote nothing")
		}
		require.NoError(t, b.Complete(bg, c2, s.done(c2.Started, []byte("second"), nil)))
		require.Equal(t, []byte("second"), s.lookup("k").Response)
	})

	t.Run("a claim that expected another version answers ClaimChanged", func(t *testing.T) {
		b, s := fresh(t)
		if !s.info.Shared {
			t.Skip("Info.Shared is false: one engine holds the store, and it knows what it read")
		}
		c := s.claim("k", 1, nil)
		require.NoError(t, b.Release(bg, c, c.Started))
		prev := s.lookup("k")
		c2 := s.claim("k", 2, prev)
		require.NoError(t, b.Complete(bg, c2, s.done(c2.Started, []byte("x"), nil)))
		res, err := b.Claim(bg, idemcore.ClaimRequest{Started: s.started("k", 2), Prev: prev})
		require.NoError(t, err)
		require.Equal(t, idemcore.ClaimChanged, res.Status)
		require.NotNil(t, res.Current)
		require.Equal(t, idemcore.StateDone, res.Current.State)
	})

	t.Run("a claim-first Claim answers the live record it finds and writes nothing", func(t *testing.T) {
		b, s := fresh(t)
		if !s.info.ClaimFirst {
			t.Skip("Info.ClaimFirst is false: the engine claims only a key it found free")
		}
		c1 := s.claim("k", 1, nil)
		other := s.started("k", 1)
		other.Fingerprint = 7
		res, err := b.Claim(bg, idemcore.ClaimRequest{Started: other})
		require.NoError(t, err)
		require.Equal(t, idemcore.ClaimChanged, res.Status, "a live started record is not claimed again")
		require.NotNil(t, res.Current)
		require.Equal(t, idemcore.StateStarted, res.Current.State)
		require.Equal(t, uint64(42), res.Current.Fingerprint, "the record found, not the one asked for")
		require.NoError(t, b.Complete(bg, c1, s.done(c1.Started, []byte("first"), nil)), "the read took no fencing token")

		res, err = b.Claim(bg, idemcore.ClaimRequest{Started: other})
		require.NoError(t, err)
		require.Equal(t, idemcore.ClaimChanged, res.Status, "a live done record is not claimed again")
		require.Equal(t, idemcore.StateDone, res.Current.State)
		require.Equal(t, []byte("first"), res.Current.Response)
		got := s.isDone("k", "first")
		require.Equal(t, uint64(42), got.Fingerprint, "nothing written")

		// A record outside its window is replaced by the claim.
		short := s.started("j", 1)
		short.Retention = time.Millisecond
		c := s.claimReq(idemcore.ClaimRequest{Started: short})
		require.NoError(t, b.Complete(bg, c, s.done(c.Started, []byte("old"), nil)))
		time.Sleep(20 * time.Millisecond) // past the window (not a timing assertion)
		again := s.started("j", 1)
		again.Retention, again.Fingerprint = time.Millisecond, 7
		again.StartedAt = s.now.Add(time.Minute) // a backend with Info.Clock stamps its own
		c2 := s.claimReq(idemcore.ClaimRequest{Started: again})
		require.Greater(t, c2.Token, c.Token)
	})

	t.Run("a claim-first RunTx of a free key refuses a live record before fn runs", func(t *testing.T) {
		b, s := fresh(t)
		if !s.info.ClaimFirst {
			t.Skip("Info.ClaimFirst is false: the engine runs DoTx only on a key it found free")
		}
		c := s.claim("k", 1, nil)
		ran := 0
		fn := func(tx T) (*idemcore.Record, error) {
			ran++
			return s.done(s.started("k", 1), []byte("second"), nil), nil
		}
		// The engine claims first (no Lookup): RunTx must say the key is
		// taken, live started or done, and leave the record as it was.
		err := b.RunTx(bg, &idemcore.Claim{Key: "k", Fingerprint: 7}, fn)
		require.ErrorIs(t, err, idemcore.ErrClaimTaken, "a live started record")
		require.NoError(t, b.Complete(bg, c, s.done(c.Started, []byte("first"), nil)), "the started record is untouched")
		err = b.RunTx(bg, &idemcore.Claim{Key: "k", Fingerprint: 7}, fn)
		require.ErrorIs(t, err, idemcore.ErrClaimTaken, "a live done record")
		require.Zero(t, ran, "fn ran on a key with a live record")
		got := s.isDone("k", "first")
		require.Equal(t, uint64(42), got.Fingerprint, "nothing written")
	})

	t.Run("release without a record to restore frees the key", func(t *testing.T) {
		b, s := fresh(t)
		c := s.claim("k", 1, nil)
		require.NoError(t, b.Release(bg, c, nil))
		require.Nil(t, s.lookup("k"))
		s.claim("k", 1, nil) // free again
	})

	t.Run("RunTx commits the done record and its messages together", func(t *testing.T) {
		b, s := fresh(t)
		err := b.RunTx(bg, &idemcore.Claim{Key: "k", Fingerprint: 42}, func(tx T) (*idemcore.Record, error) {
			s.enqueue(tx, "k", 0, "charge", []byte("1200"))
			s.enqueue(tx, "k", 1, "email", nil)
			return s.done(s.started("k", 1), []byte("ord_1"), nil), nil
		})
		require.NoError(t, err)
		s.isDone("k", "ord_1")
		ms := s.messages()
		require.Len(t, ms, 2)
		require.Less(t, ms[0].Seq, ms[1].Seq, "Seq increases in enqueue order")
		require.Equal(t, "charge", ms[0].Topic)
		require.Equal(t, []byte("1200"), ms[0].Payload)
		require.Nil(t, ms[1].Payload, "a nil payload stays nil")
		for i, m := range ms {
			require.Equal(t, "k", m.Key)
			require.Equal(t, i, m.Index)
			require.Equal(t, "k", m.OrderingKey)
			require.False(t, m.Dead)
		}
	})

	t.Run("RunTx whose fn fails commits nothing and returns fn's error", func(t *testing.T) {
		b, s := fresh(t)
		errFn := errors.New("fn failed")
		err := b.RunTx(bg, &idemcore.Claim{Key: "k", Fingerprint: 42}, func(tx T) (*idemcore.Record, error) {
			s.enqueue(tx, "k", 0, "charge", []byte("1200"))
			return nil, errFn
		})
		require.ErrorIs(t, err, errFn)
		require.Nil(t, s.lookup("k"))
		require.Empty(t, s.messages())
	})

	t.Run("RunTx on a claim of Claim replaces its started record", func(t *testing.T) {
		b, s := fresh(t)
		c := s.claim("k", 1, nil)
		err := b.RunTx(bg, c, func(tx T) (*idemcore.Record, error) {
			return s.done(c.Started, []byte("tx"), nil), nil
		})
		require.NoError(t, err)
		s.isDone("k", "tx")
	})

	t.Run("Forget deletes a record in any state and says whether there was one", func(t *testing.T) {
		b, s := fresh(t)
		c := s.claim("done", 1, nil)
		require.NoError(t, b.Complete(bg, c, s.done(c.Started, []byte("x"), nil)))
		c = s.claim("started", 1, nil)
		require.NoError(t, b.Release(bg, c, c.Started))
		for _, key := range []string{"done", "started"} {
			found, err := b.Forget(bg, key)
			require.NoError(t, err)
			require.True(t, found, key)
			require.Nil(t, s.lookup(key), key)
		}
		found, err := b.Forget(bg, "done")
		require.NoError(t, err)
		require.False(t, found, "a second Forget finds nothing")
	})

	t.Run("Resolve stores fn's record in one transaction; fn's error writes nothing", func(t *testing.T) {
		b, s := fresh(t)
		c := s.claim("k", 1, nil)
		require.NoError(t, b.Release(bg, c, c.Started))
		errNo := errors.New("no")
		err := b.Resolve(bg, "k", func(cur *idemcore.Record) (*idemcore.Record, error) { return nil, errNo })
		require.ErrorIs(t, err, errNo)
		require.Equal(t, idemcore.StateStarted, s.lookup("k").State)
		err = b.Resolve(bg, "k", func(cur *idemcore.Record) (*idemcore.Record, error) {
			require.NotNil(t, cur)
			require.Equal(t, idemcore.StateStarted, cur.State)
			return s.done(cur, []byte("by hand"), nil), nil
		})
		require.NoError(t, err)
		s.isDone("k", "by hand")
	})

	t.Run("Prune deletes exactly the expired records, in batches", func(t *testing.T) {
		b, s := fresh(t)
		short := func(key string, state idemcore.State, retention time.Duration) {
			st := s.started(key, 1)
			st.Retention = retention
			c := s.claimReq(idemcore.ClaimRequest{Started: st})
			if state == idemcore.StateDone {
				require.NoError(t, b.Complete(bg, c, s.done(c.Started, []byte(key), nil)))
			} else {
				require.NoError(t, b.Release(bg, c, c.Started))
			}
		}
		short("old-1", idemcore.StateDone, time.Minute)
		short("old-2", idemcore.StateDone, time.Minute)
		short("old-started", idemcore.StateStarted, time.Minute)
		short("fresh", idemcore.StateDone, 365*24*time.Hour)
		// Three days on: past any slot a backend groups records in (bbolt's
		// are as wide as the window it was opened with, a day by default).
		req := idemcore.PruneRequest{Now: s.now.Add(72 * time.Hour), Retention: time.Minute, KeepStarted: true, Limit: 1}
		res, err := b.Prune(bg, req)
		require.NoError(t, err)
		require.Equal(t, idemcore.PruneResult{Deleted: 2}, res, "KeepStarted keeps the started record")
		require.NotNil(t, s.lookup("old-started"))
		req.KeepStarted = false
		res, err = b.Prune(bg, req)
		require.NoError(t, err)
		require.Equal(t, idemcore.PruneResult{Deleted: 1, Interrupted: 1}, res)
		for _, key := range []string{"old-1", "old-2", "old-started"} {
			require.Nil(t, s.lookup(key), key)
		}
		require.NotNil(t, s.lookup("fresh"), "a record inside its window is kept")
	})

	t.Run("Scan walks every record; fn's error stops it", func(t *testing.T) {
		b, s := fresh(t)
		for _, key := range []string{"a", "b", "c"} {
			c := s.claim(key, 1, nil)
			require.NoError(t, b.Complete(bg, c, s.done(c.Started, []byte(key), nil)))
		}
		var keys []string
		require.NoError(t, b.Scan(bg, func(r *idemcore.Record, err error) error {
			require.NoError(t, err)
			keys = append(keys, r.Key)
			require.Equal(t, r.Key, string(r.Response))
			return nil
		}))
		slices.Sort(keys)
		require.Equal(t, []string{"a", "b", "c"}, keys)
		errStop := errors.New("stop")
		n := 0
		err := b.Scan(bg, func(*idemcore.Record, error) error { n++; return errStop })
		require.ErrorIs(t, err, errStop)
		require.Equal(t, 1, n)
	})

	t.Run("outbox: the due head of each ordering key is claimed once, in Seq order", func(t *testing.T) {
		b, s := fresh(t)
		s.commit("a", "a0", "a1")
		s.commit("b", "b0")
		due := s.claimDue(s.now, 10)
		require.Equal(t, []string{"a0", "b0"}, payloads(due.Messages), "one head per ordering key")
		require.Empty(t, s.claimDue(s.now, 10).Messages, "claimed heads are not claimed again")
		for _, m := range due.Messages {
			_, err := b.RenewClaim(bg, m)
			require.NoError(t, err, "RenewClaim of a held claim")
		}
		require.NoError(t, b.Delivered(bg, due.Messages[0]))
		require.ErrorIs(t, b.Delivered(bg, due.Messages[0]), idemcore.ErrMessageNotFound, "Delivered twice")
		require.Equal(t, []string{"a1"}, payloads(s.claimDue(s.now, 10).Messages), "the next head once a0 is delivered")
		require.Equal(t, []string{"a1", "b0"}, payloads(s.messages()))
	})

	t.Run("outbox: limit bounds a claim", func(t *testing.T) {
		_, s := fresh(t)
		s.commit("a", "a0")
		s.commit("b", "b0")
		s.commit("c", "c0")
		require.Len(t, s.claimDue(s.now, 2).Messages, 2)
		require.Len(t, s.claimDue(s.now, 2).Messages, 1)
	})

	t.Run("outbox: a failed message is stored back and due again after its backoff", func(t *testing.T) {
		b, s := fresh(t)
		s.commit("a", "a0")
		m := s.claimDue(s.now, 10).Messages[0]
		m.Failures, m.LastError, m.NextAttemptAt = 1, "gateway down", s.now.Add(time.Hour)
		require.NoError(t, b.Failed(bg, m))
		due := s.claimDue(s.now, 10)
		require.Empty(t, due.Messages, "not due before NextAttemptAt")
		if s.info.Clock == nil {
			require.True(t, due.Next.Equal(m.NextAttemptAt), "Due.Next: %v, want %v", due.Next, m.NextAttemptAt)
			due = s.claimDue(s.now.Add(2*time.Hour), 10)
			require.Len(t, due.Messages, 1)
			got := due.Messages[0]
			require.Equal(t, 1, got.Failures)
			require.Equal(t, "gateway down", got.LastError)
		}
		ms := s.messages()
		require.Len(t, ms, 1)
		require.Equal(t, 1, ms[0].Failures)
	})

	t.Run("outbox: dead letters are listed, hold nothing back, retried and dropped", func(t *testing.T) {
		b, s := fresh(t)
		s.commit("a", "a0", "a1")
		m := s.claimDue(s.now, 10).Messages[0]
		s.kill(m)
		require.Equal(t, []string{"a1"}, payloads(s.claimDue(s.now, 10).Messages), "a dead letter holds back nothing")
		ms := s.messages()
		require.Len(t, ms, 2)
		require.False(t, ms[0].Dead, "pending messages come first")
		require.True(t, ms[1].Dead)
		require.Equal(t, m.Seq, ms[1].Seq)
		require.Equal(t, 3, ms[1].Failures)
		require.Equal(t, time.Hour, ms[1].DeadLetterRetention)

		errNo := errors.New("no")
		require.ErrorIs(t, b.RetryDead(bg, m.Seq, func(*idemcore.Message) error { return errNo }), errNo)
		require.NoError(t, b.RetryDead(bg, m.Seq, func(d *idemcore.Message) error {
			require.True(t, d.Dead)
			d.Failures, d.NextAttemptAt, d.Dead, d.DeadAt, d.DeadLetterRetention = 0, time.Time{}, false, time.Time{}, 0
			return nil
		}))
		back := s.claimDue(s.now, 10).Messages
		require.Equal(t, []string{"a0"}, payloads(back), "a retried dead letter is pending again, with its Seq")
		require.Equal(t, m.Seq, back[0].Seq)
		require.Zero(t, back[0].Failures)

		s.kill(back[0])
		require.NoError(t, b.DropDead(bg, m.Seq))
		require.Equal(t, []string{"a1"}, payloads(s.messages()))
		require.True(t, notFound(b.DropDead(bg, m.Seq)), "DropDead of a missing seq")
		require.True(t, notFound(b.RetryDead(bg, m.Seq, func(*idemcore.Message) error { return nil })), "RetryDead of a missing seq")
	})

	t.Run("outbox: PruneDead deletes the expired dead letters", func(t *testing.T) {
		b, s := fresh(t)
		s.commit("a", "a0")
		s.commit("b", "b0")
		s.commit("c", "c0")
		ms := s.claimDue(s.now, 10).Messages
		for _, m := range ms {
			s.kill(m)
		}
		n, err := b.PruneDead(bg, func(m *idemcore.Message) bool { return string(m.Payload) != "b0" }, 1)
		require.NoError(t, err)
		require.Equal(t, 2, n)
		require.Equal(t, []string{"b0"}, payloads(s.messages()))
	})

	t.Run("WaitChange returns ctx.Err() once ctx ends, and returns without a change", func(t *testing.T) {
		b, _ := fresh(t)
		ctx, cancel := context.WithCancel(bg)
		cancel()
		require.ErrorIs(t, b.WaitChange(ctx, "k"), context.Canceled)
		// A bound on a hang, not a timing claim: it returns after a poll.
		ctx, cancel = context.WithTimeout(bg, time.Minute)
		defer cancel()
		require.NoError(t, b.WaitChange(ctx, "k"))
	})
}

// EngineBackend opens an engine with open, passing it the wrap its backend
// goes through (as Harness.OpenWrapped takes one), and returns that backend,
// for RunBackend on a backend whose engine opens it. The engine is closed,
// and with it the backend, when t ends; open it without a pruner or a
// dispatcher (Options.PruneInterval -1, Outbox.Dispatch false), so that only
// the suite drives the backend.
func EngineBackend[T any](t testing.TB, open func(wrap func(idemcore.Backend[T]) idemcore.Backend[T]) (Engine[T], error)) idemcore.Backend[T] {
	t.Helper()
	var b idemcore.Backend[T]
	e, err := open(func(inner idemcore.Backend[T]) idemcore.Backend[T] { b = inner; return inner })
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return b
}

// seam is one backend under the seam suite, with the helpers its cases share.
type seam[T any] struct {
	t    *testing.T
	b    idemcore.Backend[T]
	info idemcore.Info
	now  time.Time // the times the suite passes: Info.Clock's reading, or start
}

// started is a started record of key at attempt, started at s.now.
func (s *seam[T]) started(key string, attempt int) *idemcore.Record {
	return &idemcore.Record{Key: key, State: idemcore.StateStarted, Fingerprint: 42, Attempt: attempt,
		StartedAt: s.now, Retention: time.Hour}
}

// done is the done record that completes st with resp and e, a second later.
func (s *seam[T]) done(st *idemcore.Record, resp []byte, e *idemcore.Error) *idemcore.Record {
	d := *st
	d.State, d.Response, d.Err, d.CompletedAt = idemcore.StateDone, resp, e, st.StartedAt.Add(time.Second)
	return &d
}

// claim claims key at attempt, taking prev over if set; it must succeed.
func (s *seam[T]) claim(key string, attempt int, prev *idemcore.Record) *idemcore.Claim {
	s.t.Helper()
	return s.claimReq(idemcore.ClaimRequest{Started: s.started(key, attempt), Prev: prev})
}

func (s *seam[T]) claimReq(req idemcore.ClaimRequest) *idemcore.Claim {
	s.t.Helper()
	res, err := s.b.Claim(bg, req)
	require.NoError(s.t, err, "Claim %s", req.Started.Key)
	require.Equal(s.t, idemcore.Claimed, res.Status, "Claim %s", req.Started.Key)
	require.NotNil(s.t, res.Claim)
	return res.Claim
}

// lookup returns key's stored record.
func (s *seam[T]) lookup(key string) *idemcore.Record {
	s.t.Helper()
	r, _, err := s.b.Lookup(bg, idemcore.Lookup{Key: key, Now: s.now, Retention: time.Hour})
	require.NoError(s.t, err, "Lookup %s", key)
	return r
}

// isDone checks that key's record is done with response resp, and returns
// it.
func (s *seam[T]) isDone(key, resp string) *idemcore.Record {
	s.t.Helper()
	r := s.lookup(key)
	require.NotNil(s.t, r, key)
	require.Equal(s.t, idemcore.StateDone, r.State, key)
	require.Equal(s.t, resp, string(r.Response), key)
	return r
}

// sameTime checks that the backend stored want, unless it stamps its own
// times (Info.Clock), which the suite then only checks are set.
func (s *seam[T]) sameTime(want, got time.Time, what string) {
	s.t.Helper()
	if s.info.Clock != nil {
		require.False(s.t, got.IsZero(), "%s is stamped", what)
		return
	}
	require.True(s.t, want.Equal(got), "%s: got %v, want %v", what, got, want)
}

// enqueue enqueues message index of key's call in tx, as the engine does.
func (s *seam[T]) enqueue(tx T, key string, index int, topic string, payload []byte) {
	s.t.Helper()
	m := &idemcore.Message{Topic: topic, Key: key, Index: index, OrderingKey: key, Payload: payload, EnqueuedAt: s.now}
	require.NoError(s.t, s.b.Enqueue(tx, m))
	require.NotZero(s.t, m.Seq, "Enqueue sets Seq")
}

// commit runs a DoTx of key that enqueues one message per payload.
func (s *seam[T]) commit(key string, payloads ...string) {
	s.t.Helper()
	err := s.b.RunTx(bg, &idemcore.Claim{Key: key, Fingerprint: 42}, func(tx T) (*idemcore.Record, error) {
		for i, p := range payloads {
			s.enqueue(tx, key, i, "topic", []byte(p))
		}
		return s.done(s.started(key, 1), nil, nil), nil
	})
	require.NoError(s.t, err)
}

// claimDue claims due heads at now.
func (s *seam[T]) claimDue(now time.Time, limit int) idemcore.Due {
	s.t.Helper()
	due, err := s.b.ClaimDue(bg, now, limit)
	require.NoError(s.t, err)
	require.Empty(s.t, due.Quarantined)
	return due
}

// kill moves claimed message m to the dead letters, as the engine does
// after its last attempt.
func (s *seam[T]) kill(m *idemcore.Message) {
	s.t.Helper()
	m.Failures, m.LastError, m.Dead, m.DeadAt, m.DeadLetterRetention = 3, "gave up", true, s.now, time.Hour
	require.NoError(s.t, s.b.Failed(bg, m))
}

// messages lists the outbox: pending messages, then dead letters.
func (s *seam[T]) messages() []*idemcore.Message {
	s.t.Helper()
	var ms []*idemcore.Message
	require.NoError(s.t, s.b.Messages(bg, func(m *idemcore.Message, err error) error {
		require.NoError(s.t, err)
		ms = append(ms, m)
		return nil
	}))
	return ms
}

// payloads gives the messages' payloads as strings.
func payloads(ms []*idemcore.Message) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = string(m.Payload)
	}
	return out
}

// notFound reports whether err says a message is missing, as
// ErrMessageNotFound or ErrNotFound.
func notFound(err error) bool {
	return errors.Is(err, idemcore.ErrMessageNotFound) || errors.Is(err, idemcore.ErrNotFound)
}
