package idemtest

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/internal/testkit"
)

// shared holds "several processes, one truth" (DESIGN.md, "Backends") on a
// store that engines in several processes share (Harness.OwnedAcrossProcesses):
// every operator call made through one engine (Forget, Resolve, RetryDead,
// DropDead) is what the next call of every other engine sees, at once: no
// engine answers from its memory (the replay cache, a claim it holds) what
// the store no longer holds. Two engines in this process stand for two
// processes (each with its own connections and memory), one case runs the
// operator call in a child process; the other engine's call comes right
// after the operator call returned, with the default Options (the replay
// cache on).
func (s *suite[T]) shared(t *testing.T) {
	if !s.h.OwnedAcrossProcesses {
		t.Skip("idemtest: one process holds the store at a time (Harness.OwnedAcrossProcesses is false): there is no other engine to see an operator call")
	}
	// pair opens two engines on a new store, with one clock.
	pair := func(t *testing.T, opts Options) (a, b Engine[T], store string) {
		if opts.Now == nil {
			opts.Now = newClock().Now
		}
		a, store = s.fresh(t, opts)
		return a, s.open(t, store, opts), store
	}
	replays := func(t *testing.T, e Engine[T], v via, key, want string, msg string) {
		t.Helper()
		res, err := call(bg, e, v, key, fp, mustNotRun[T](t))
		require.NoError(t, err, msg)
		require.True(t, res.Replayed, msg)
		require.Equal(t, want, string(res.Response), msg)
		require.Equal(t, want, string(record(t, e, key).Response), msg+": Get says the same")
	}
	runs := func(t *testing.T, e Engine[T], v via, key, resp string, msg string) {
		t.Helper()
		res, err := call(bg, e, v, key, fp, func(ctx context.Context, _ T) ([]byte, error) {
			wantCall(t, ctx, idemcore.Call{Key: key, Attempt: 1}, msg)
			return []byte(resp), nil
		})
		require.NoError(t, err, msg)
		require.False(t, res.Replayed, msg+": fn runs as new")
		require.Equal(t, resp, string(res.Response), msg)
	}

	// After B's Forget, the next call (A's, or B's own) runs fn as new, and
	// the other engine replays that new outcome, never its memory of the old.
	for _, c := range []struct {
		name           string
		next           bool // B makes the next call
		resp, run, rep string
	}{
		{"Forget on one engine: the other's next call runs fn as new", false, "A-run2", "A's call right after B's Forget", "B replays A's new outcome"},
		{"Forget on one engine, a new outcome stored there: the other replays it", true, "B-run2", "B's call after its Forget", "A replays what the store holds"},
	} {
		t.Run(c.name, func(t *testing.T) {
			both(t, func(t *testing.T, v via) {
				a, b, _ := pair(t, Options{})
				runs(t, a, v, "k", "A-run1", "A's first call")
				replays(t, a, v, "k", "A-run1", "A's replay")
				require.NoError(t, b.Forget("k"))
				next, other := a, b
				if c.next {
					next, other = b, a
				}
				runs(t, next, v, "k", c.resp, c.run)
				replays(t, other, v, "k", c.resp, c.rep)
			})
		})
	}

	t.Run("Forget on one engine: a stored error is not replayed by the other", func(t *testing.T) {
		both(t, func(t *testing.T, v via) {
			a, b, _ := pair(t, Options{})
			_, err := call(bg, a, v, "k", fp, func(context.Context, T) ([]byte, error) {
				return nil, idemcore.WithCode(errDeclined, "card_declined")
			})
			var ie *idemcore.Error
			require.ErrorAs(t, err, &ie)
			require.NoError(t, b.Forget("k"))
			runs(t, a, v, "k", "paid", "A's call right after B's Forget")
		})
	})

	t.Run("Forget on one engine: the key is new to the other, any fingerprint", func(t *testing.T) {
		a, b, _ := pair(t, Options{})
		runs(t, a, viaDo, "k", "A-run1", "A's first call")
		require.NoError(t, b.Forget("k"))
		res, err := a.Do(bg, "k", other, func(context.Context) ([]byte, error) { return []byte("another request"), nil })
		require.NoError(t, err, "no conflict with a forgotten record")
		require.False(t, res.Replayed)
	})

	for _, policy := range []idemcore.RecoveryPolicy{idemcore.RecoverReexecute, idemcore.RecoverRefuse} {
		t.Run("Resolve on one engine: the other replays the resolution, "+policyName(policy), func(t *testing.T) {
			both(t, func(t *testing.T, v via) {
				a, b, _ := pair(t, Options{Recovery: policy})
				// A's memory of an earlier outcome of the key, then an
				// interrupted execution in B that an operator resolves.
				runs(t, a, v, "k", "A-run1", "A's first call")
				require.NoError(t, b.Forget("k"))
				s.interrupt(t, b, "k")
				require.NoError(t, b.Resolve("k", []byte("by hand"), nil))
				replays(t, a, v, "k", "by hand", "A's call right after B's Resolve")

				runs(t, a, v, "k2", "A-run1", "A's first call")
				require.NoError(t, b.Forget("k2"))
				s.interrupt(t, b, "k2")
				require.NoError(t, b.Resolve("k2", nil, &idemcore.Error{Code: "refunded", Message: "refunded by hand"}))
				res, err := call(bg, a, v, "k2", fp, mustNotRun[T](t))
				var ie *idemcore.Error
				require.ErrorAs(t, err, &ie, "A replays the resolved error")
				require.Equal(t, "refunded", ie.Code)
				require.True(t, res.Replayed)
				require.Nil(t, res.Response)
			})
		})
	}

	t.Run("Forget in another process: the next call here runs fn as new", func(t *testing.T) {
		a, _, store := pair(t, Options{})
		runs(t, a, viaDo, crashKey, "A-run1", "A's first call")
		replays(t, a, viaDo, crashKey, "A-run1", "A's replay")
		c := s.startChild(t, childForget, store, idemcore.RecoverReexecute)
		c.Await("forgotten")
		c.Kill()
		runs(t, a, viaDo, crashKey, "A-run2", "A's call right after the child's Forget")
	})

	// dead runs the outbox with a handler that fails until healthy, one
	// attempt per message, on engine a; b has no dispatcher. It returns
	// the dead letters of n messages, as b sees them.
	dead := func(t *testing.T, n int) (a, b Engine[T], rec *testkit.Recorder, healthy *atomic.Bool, letters []*idemcore.Message) {
		c := newClock()
		rec, healthy = new(testkit.Recorder), new(atomic.Bool)
		h := rec.Handler(func(idemcore.Message) error {
			if healthy.Load() {
				return nil
			}
			return errors.New("gateway down")
		})
		a, store := s.fresh(t, outboxOptions(c, map[string]idemcore.Handler{"charge": h}, idemcore.OutboxOptions{MaxAttempts: 1}))
		b = s.open(t, store, Options{Now: c.Now})
		for i := range n {
			s.enqueue(t, a, "order-"+string(rune('1'+i)), "charge", []byte{byte('a' + i)})
		}
		testkit.Eventually(t, "the dead letters", nil, func() bool {
			letters = letters[:0]
			for _, m := range messages(t, b) {
				if m.Dead {
					letters = append(letters, m)
				}
			}
			return len(letters) == n
		})
		return a, b, rec, healthy, letters
	}

	t.Run("RetryDead on one engine: the other's dispatcher delivers the letter", func(t *testing.T) {
		a, b, rec, healthy, letters := dead(t, 1)
		healthy.Store(true)
		require.NoError(t, b.RetryDead(letters[0].Seq))
		testkit.Eventually(t, "the retried letter's delivery by A", nil, func() bool { return len(rec.Delivered()) == 1 })
		d := rec.Delivered()[0]
		require.Equal(t, []byte("a"), d.Payload)
		require.Equal(t, 1, d.Attempt, "its attempt count starts again")
		testkit.Eventually(t, "an empty outbox", nil, func() bool { return len(messages(t, a)) == 0 && len(messages(t, b)) == 0 })
		require.ErrorIs(t, a.RetryDead(letters[0].Seq), idemcore.ErrMessageNotFound, "retried and delivered: no longer a dead letter")
		require.ErrorIs(t, b.RetryDead(letters[0].Seq), idemcore.ErrMessageNotFound)
	})

	t.Run("DropDead on one engine: the letter is gone for the other", func(t *testing.T) {
		a, b, _, _, letters := dead(t, 2)
		require.NoError(t, b.DropDead(letters[0].Seq))
		var seqs []uint64
		for _, m := range messages(t, a) {
			seqs = append(seqs, m.Seq)
		}
		require.Equal(t, []uint64{letters[1].Seq}, seqs, "A lists what the store holds")
		require.ErrorIs(t, a.DropDead(letters[0].Seq), idemcore.ErrMessageNotFound, "dropped already")
		require.ErrorIs(t, a.RetryDead(letters[0].Seq), idemcore.ErrMessageNotFound, "dropped: nothing to retry")
		require.NoError(t, a.DropDead(letters[1].Seq))
		require.Empty(t, messages(t, b))
	})

	t.Run("a handler that fails after its claim lapsed does not undo another engine's RetryDead", func(t *testing.T) {
		// A's handler runs past its claim's lease; B's dispatcher claims the
		// message, fails it into the dead letters, and an operator retries
		// it. A's late failure is an answer about a claim the store no
		// longer holds: it must not send the retried message back to the
		// dead letters (nor change its count of failures).
		c := newClock()
		entered, release := make(chan struct{}), make(chan struct{})
		var once sync.Once
		var rec testkit.Recorder
		slow := rec.Handler(func(m idemcore.Message) error {
			first := false
			once.Do(func() { first = true })
			if !first {
				return nil // the retried letter, delivered
			}
			close(entered)
			<-release
			return errors.New("late failure")
		})
		// One worker: A claims nothing more while its first handler runs.
		a, store := s.fresh(t, outboxOptions(c, map[string]idemcore.Handler{"charge": slow}, idemcore.OutboxOptions{MaxAttempts: 1, Workers: 1}))
		s.enqueue(t, a, "order-1", "charge", []byte("1200"))
		<-entered
		s.h.ExpireOwners(t, store) // A's claim lapses
		failing := func(context.Context, idemcore.Message) error { return errors.New("gateway down") }
		b := s.open(t, store, outboxOptions(c, map[string]idemcore.Handler{"charge": failing}, idemcore.OutboxOptions{MaxAttempts: 1}))
		var letter *idemcore.Message
		testkit.Eventually(t, "B's dead letter", nil, func() bool {
			ms := messages(t, b)
			if len(ms) == 1 && ms[0].Dead {
				letter = ms[0]
			}
			return letter != nil
		})
		require.NoError(t, b.Close())
		op := s.open(t, store, Options{Now: c.Now})
		require.NoError(t, op.RetryDead(letter.Seq))
		close(release)
		deadAgain := func() bool {
			for _, m := range messages(t, op) {
				if m.Dead {
					return true
				}
			}
			return false
		}
		testkit.Eventually(t, "the retried letter's delivery, or its return to the dead letters", nil, func() bool {
			return len(rec.Delivered()) == 1 || deadAgain()
		})
		require.False(t, deadAgain(), "A's late failure sent the retried letter back to the dead letters")
		require.Len(t, rec.Delivered(), 1)
		require.Equal(t, 1, rec.Delivered()[0].Attempt, "the retry's count of failures starts again; A's late failure is not counted")
		testkit.Eventually(t, "an empty outbox", nil, func() bool { return len(messages(t, op)) == 0 })
	})
}
