package idem_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit"
	"github.com/idemkit/idem/internal/testkit/boltkit"
)

var obStart = time.Date(2025, 1, 2, 10, 0, 0, 0, time.UTC)

// obOpen opens an engine with a fake clock and a running dispatcher that
// polls every millisecond.
func obOpen(t testing.TB, clock *testkit.Clock, o idem.OutboxOptions) (*idem.Engine, string) {
	t.Helper()
	o.Dispatch = true
	if o.PollInterval == 0 {
		o.PollInterval = time.Millisecond
	}
	return boltkit.OpenFile(t, &idem.BoltOptions{NoSync: true}, &idem.Options{Now: clock.Now, PruneInterval: -1, Outbox: o})
}

// obReopen opens the file at path again with a dispatcher delivering topic
// "charge" to a Recorder, closes it and checks the file when t ends.
func obReopen(t testing.TB, path string, file *idem.BoltOptions, opts *idem.Options) (*idem.Engine, *testkit.Recorder) {
	t.Helper()
	rec := new(testkit.Recorder)
	opts.Outbox = idem.OutboxOptions{Dispatch: true, PollInterval: time.Millisecond,
		Handlers: map[string]idem.Handler{"charge": rec.Handler(nil)}}
	e, err := idem.OpenFile(path, file, opts)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.Close()); boltkit.Check(t, path) })
	return e, rec
}

// obMsg is a message to enqueue: ordering "" means the default.
type obMsg struct {
	topic, ordering, payload string
}

// obCall runs a DoTx with key that enqueues msgs.
func obCall(t testing.TB, e *idem.Engine, key string, msgs ...obMsg) {
	t.Helper()
	require.NoError(t, obEnqueue(e, key, msgs...))
}

// obEnqueue is obCall for a goroutine other than the test's: it returns the
// error instead of stopping the test.
func obEnqueue(e *idem.Engine, key string, msgs ...obMsg) error {
	_, err := e.DoTx(context.Background(), key, []byte(key), func(ctx context.Context, tx *idem.Tx) ([]byte, error) {
		for _, m := range msgs {
			var payload []byte
			if m.payload != "" {
				payload = []byte(m.payload)
			}
			if err := tx.EnqueueOrdered(m.topic, m.ordering, payload); err != nil {
				return nil, err
			}
		}
		return nil, nil
	})
	return err
}

func obStats(t testing.TB, e *idem.Engine) idem.OutboxStats {
	t.Helper()
	s, err := e.ScanFile()
	require.NoError(t, err)
	return s.Outbox
}

func obMessages(t testing.TB, e *idem.Engine) []*idem.Message {
	t.Helper()
	var out []*idem.Message
	require.NoError(t, e.Messages(func(m *idem.Message, err error) error {
		require.NoError(t, err)
		out = append(out, m)
		return nil
	}))
	return out
}

func TestOutboxDeliversEveryMessageWithItsFields(t *testing.T) {
	clock := testkit.NewClock(obStart)
	var rec testkit.Recorder
	e, _ := obOpen(t, clock, idem.OutboxOptions{Handlers: map[string]idem.Handler{
		"charge_card": rec.Handler(nil), "send_email": rec.Handler(nil)}})

	obCall(t, e, "order-1", obMsg{"charge_card", "", "1200"}, obMsg{"send_email", "", "receipt"}, obMsg{"charge_card", "", ""})
	testkit.Eventually(t, "3 deliveries", nil, func() bool { return len(rec.Delivered()) == 3 })
	testkit.Eventually(t, "removal", nil, func() bool { return obStats(t, e).Delivered == 3 })

	got := rec.Delivered()
	for i, m := range got {
		require.Equal(t, "order-1", m.Key)
		require.Equal(t, i, m.Index, "in enqueue order: one ordering key")
		require.Equal(t, fmt.Sprintf("order-1/%d", i), m.DownstreamKey)
		require.Equal(t, idem.DownstreamKey("order-1", i), m.DownstreamKey)
		require.Equal(t, "order-1", m.OrderingKey)
		require.Equal(t, 1, m.Attempt)
		require.True(t, m.EnqueuedAt.Equal(obStart))
		require.False(t, m.Dead)
	}
	require.Equal(t, []string{"charge_card", "send_email", "charge_card"}, []string{got[0].Topic, got[1].Topic, got[2].Topic})
	require.Equal(t, []byte("1200"), got[0].Payload)
	require.Nil(t, got[2].Payload, "nil payload stays nil")
	require.Less(t, got[0].Seq, got[1].Seq)
	require.Empty(t, obMessages(t, e), "delivered messages are removed")
	require.Equal(t, idem.OutboxStats{Delivered: 3}, obStats(t, e))

	// A replay of the call enqueues nothing more.
	obCall(t, e, "order-1", obMsg{"charge_card", "", "1200"})
	require.Equal(t, idem.OutboxStats{Delivered: 3}, obStats(t, e))
}

func TestOutboxHandlerFailingNTimesThenSucceeding(t *testing.T) {
	const failures = 4
	clock := testkit.NewClock(obStart)
	var rec testkit.Recorder
	h := rec.Handler(func(m idem.Message) error {
		if m.Attempt <= failures {
			return fmt.Errorf("gateway timeout %d", m.Attempt)
		}
		return nil
	})
	e, _ := obOpen(t, clock, idem.OutboxOptions{BaseBackoff: time.Second, MaxBackoff: time.Minute, MaxAttempts: 10,
		Handlers: map[string]idem.Handler{"charge_card": h}})

	obCall(t, e, "order-1", obMsg{"charge_card", "", "1200"})

	// Without the clock moving, the first failure's backoff holds the retry.
	testkit.Eventually(t, "the first failure recorded", nil, func() bool {
		ms := obMessages(t, e)
		return len(ms) == 1 && ms[0].Failures == 1
	})
	m := obMessages(t, e)[0]
	require.Equal(t, "gateway timeout 1", m.LastError)
	require.False(t, m.NextAttemptAt.Before(obStart.Add(500*time.Millisecond)), "backoff is at least BaseBackoff/2")
	require.False(t, m.NextAttemptAt.After(obStart.Add(time.Second)), "backoff is at most BaseBackoff")
	s := obStats(t, e)
	require.Equal(t, 1, s.Pending)
	require.Equal(t, 1, s.Retrying)

	testkit.Eventually(t, "delivery", func() { clock.Advance(time.Minute) }, func() bool { return obStats(t, e).Delivered == 1 })
	got := rec.Attempts()
	require.Len(t, got, failures+1)
	for i, m := range got {
		require.Equal(t, i+1, m.Attempt)
		require.Equal(t, "order-1/0", m.DownstreamKey, "every attempt passes the same downstream key")
	}
	require.Equal(t, idem.OutboxStats{Delivered: 1}, obStats(t, e))
}

func TestOutboxDeadLetterAfterMaxAttemptsThenRetry(t *testing.T) {
	clock := testkit.NewClock(obStart)
	var rec testkit.Recorder
	var healthy atomic.Bool
	h := rec.Handler(func(m idem.Message) error {
		if !healthy.Load() {
			return errors.New("card processor down")
		}
		return nil
	})
	e, _ := obOpen(t, clock, idem.OutboxOptions{MaxAttempts: 3, Handlers: map[string]idem.Handler{"charge_card": h}})
	advance := func() { clock.Advance(time.Hour) }

	obCall(t, e, "order-1", obMsg{"charge_card", "", "1200"})
	testkit.Eventually(t, "a dead letter", advance, func() bool { return obStats(t, e).Dead == 1 })
	require.Len(t, rec.Attempts(), 3, "MaxAttempts attempts, then dead")
	require.Equal(t, idem.OutboxStats{Dead: 1}, obStats(t, e))
	ms := obMessages(t, e)
	require.Len(t, ms, 1)
	dead := ms[0]
	require.True(t, dead.Dead)
	require.Equal(t, 3, dead.Failures)
	require.Equal(t, "card processor down", dead.LastError)
	require.False(t, dead.DeadAt.IsZero())

	require.ErrorIs(t, e.RetryDead(dead.Seq+100), idem.ErrMessageNotFound)
	healthy.Store(true)
	require.NoError(t, e.RetryDead(dead.Seq))
	require.ErrorIs(t, e.RetryDead(dead.Seq), idem.ErrMessageNotFound, "it is no longer dead")
	testkit.Eventually(t, "delivery of the retried dead letter", nil, func() bool { return obStats(t, e).Delivered == 1 })
	got := rec.Attempts()
	require.Len(t, got, 4)
	require.Equal(t, 1, got[3].Attempt, "a retried dead letter counts its attempts from 1 again")
	require.Equal(t, dead.Seq, got[3].Seq)
	require.Equal(t, "order-1/0", got[3].DownstreamKey)
	require.Equal(t, idem.OutboxStats{Delivered: 1}, obStats(t, e))
}

func TestOutboxDropDeadAndDeadLetterRetention(t *testing.T) {
	clock := testkit.NewClock(obStart)
	e, path := obOpen(t, clock, idem.OutboxOptions{MaxAttempts: 1, DeadLetterRetention: 48 * time.Hour,
		Handlers: map[string]idem.Handler{"t": func(context.Context, idem.Message) error { return errors.New("no") }}})
	obCall(t, e, "a", obMsg{"t", "", "1"})
	obCall(t, e, "b", obMsg{"t", "", "2"})
	testkit.Eventually(t, "two dead letters", nil, func() bool { return obStats(t, e).Dead == 2 })
	ms := obMessages(t, e)
	require.Len(t, ms, 2)

	require.NoError(t, e.DropDead(ms[0].Seq))
	require.ErrorIs(t, e.DropDead(ms[0].Seq), idem.ErrMessageNotFound)
	require.Equal(t, 1, obStats(t, e).Dead)

	clock.Advance(47 * time.Hour)
	require.Equal(t, 1, obStats(t, e).Dead, "inside its retention")
	clock.Advance(time.Hour)
	require.Equal(t, 0, obStats(t, e).Dead, "an expired dead letter is absent at once")
	require.Empty(t, obMessages(t, e))
	require.ErrorIs(t, e.RetryDead(ms[1].Seq), idem.ErrMessageNotFound)

	_, err := e.Prune(context.Background())
	require.NoError(t, err)
	require.NoError(t, e.Close())
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true, Timeout: time.Second})
	require.NoError(t, err)
	defer db.Close()
	require.NoError(t, db.View(func(tx *bbolt.Tx) error {
		require.Zero(t, tx.Bucket([]byte("idem")).Bucket([]byte("dead")).Stats().KeyN, "the pruner reclaimed it")
		return nil
	}))
}

func TestOutboxOrderingKeyHoldsBackLaterMessages(t *testing.T) {
	t.Run("a message waiting for its retry holds back its ordering key", func(t *testing.T) {
		clock := testkit.NewClock(obStart)
		var rec testkit.Recorder
		var chargeFailures atomic.Int32
		h := rec.Handler(func(m idem.Message) error {
			if m.Topic == "charge" && chargeFailures.Add(1) <= 2 {
				return errors.New("timeout")
			}
			return nil
		})
		e, _ := obOpen(t, clock, idem.OutboxOptions{Handlers: map[string]idem.Handler{"charge": h, "refund": h}})
		obCall(t, e, "create-7", obMsg{"charge", "order-7", "+1200"})
		obCall(t, e, "refund-7", obMsg{"refund", "order-7", "-1200"})
		testkit.Eventually(t, "both delivered", func() { clock.Advance(time.Hour) }, func() bool { return obStats(t, e).Delivered == 2 })

		var topics []string
		for _, m := range rec.Attempts() {
			require.Equal(t, "order-7", m.OrderingKey)
			topics = append(topics, m.Topic)
		}
		require.Equal(t, []string{"charge", "charge", "charge", "refund"}, topics, "the refund never overtakes its charge")
	})

	t.Run("a dead letter does not hold back its ordering key", func(t *testing.T) {
		clock := testkit.NewClock(obStart)
		var rec testkit.Recorder
		h := rec.Handler(func(m idem.Message) error {
			if m.Topic == "charge" {
				return errors.New("declined")
			}
			return nil
		})
		e, _ := obOpen(t, clock, idem.OutboxOptions{MaxAttempts: 2, Handlers: map[string]idem.Handler{"charge": h, "refund": h}})
		obCall(t, e, "create-7", obMsg{"charge", "order-7", "+1200"})
		obCall(t, e, "refund-7", obMsg{"refund", "order-7", "-1200"})
		testkit.Eventually(t, "refund delivered", func() { clock.Advance(time.Hour) }, func() bool { return obStats(t, e).Delivered == 1 })
		var topics []string
		for _, m := range rec.Attempts() {
			topics = append(topics, m.Topic)
		}
		require.Equal(t, []string{"charge", "charge", "refund"}, topics)
		require.Equal(t, idem.OutboxStats{Dead: 1, Delivered: 1}, obStats(t, e))
	})
}

func TestOutboxMessagesWithoutHandlerWait(t *testing.T) {
	clock := testkit.NewClock(obStart)
	var rec testkit.Recorder
	e, path := obOpen(t, clock, idem.OutboxOptions{Handlers: map[string]idem.Handler{"charge": rec.Handler(nil)}})

	// "email" has no handler: it waits, and holds back the charge of its
	// ordering key; another key's charge goes through.
	obCall(t, e, "order-1", obMsg{"email", "", "hello"}, obMsg{"charge", "", "1200"})
	obCall(t, e, "order-2", obMsg{"charge", "", "900"})
	testkit.Eventually(t, "order-2's charge", nil, func() bool { return obStats(t, e).Delivered == 1 })
	s := obStats(t, e)
	require.Equal(t, 2, s.Pending)
	require.Equal(t, 1, s.Waiting, "the email has no handler")

	// Handlers are fixed at Open: an Open with one for "email" delivers the rest.
	require.NoError(t, e.Close())
	e, err := idem.OpenFile(path, &idem.BoltOptions{NoSync: true}, &idem.Options{Now: clock.Now, PruneInterval: -1,
		Outbox: idem.OutboxOptions{Dispatch: true, PollInterval: time.Millisecond,
			Handlers: map[string]idem.Handler{"charge": rec.Handler(nil), "email": rec.Handler(nil)}}})
	require.NoError(t, err)
	defer func() { require.NoError(t, e.Close()) }()
	testkit.Eventually(t, "the rest", nil, func() bool { return obStats(t, e).Delivered == 2 })
	var got []string
	for _, m := range rec.Delivered() {
		got = append(got, m.Key+" "+m.Topic)
	}
	require.Equal(t, []string{"order-2 charge", "order-1 email", "order-1 charge"}, got)
}

func TestOutboxSurvivesRestart(t *testing.T) {
	clock := testkit.NewClock(obStart)
	path := filepath.Join(t.TempDir(), "idem.db")
	file, opts := &idem.BoltOptions{NoSync: true}, &idem.Options{Now: clock.Now, PruneInterval: -1}

	// No dispatcher: the messages stay in the file.
	e, err := idem.OpenFile(path, file, opts)
	require.NoError(t, err)
	obCall(t, e, "order-1", obMsg{"charge", "", "1"}, obMsg{"charge", "", "2"})
	obCall(t, e, "order-2", obMsg{"charge", "", "3"})
	s, err := e.ScanFile()
	require.NoError(t, err)
	require.Equal(t, idem.OutboxStats{Pending: 3, Waiting: 3}, s.Outbox)
	require.NoError(t, e.Close())

	e, rec := obReopen(t, path, file, opts)
	testkit.Eventually(t, "delivery after the restart", nil, func() bool { return obStats(t, e).Delivered == 3 })
	var payloads []string
	for _, m := range rec.Delivered() {
		if m.Key == "order-1" {
			payloads = append(payloads, string(m.Payload))
		}
	}
	require.Equal(t, []string{"1", "2"}, payloads)
}

func TestOutboxCloseCancelsHandlersAndKeepsTheMessage(t *testing.T) {
	clock := testkit.NewClock(obStart)
	entered := make(chan struct{})
	h := func(ctx context.Context, m idem.Message) error {
		close(entered)
		<-ctx.Done()
		return ctx.Err()
	}
	path := filepath.Join(t.TempDir(), "idem.db")
	file, opts := &idem.BoltOptions{NoSync: true}, &idem.Options{Now: clock.Now, PruneInterval: -1,
		Outbox: idem.OutboxOptions{Dispatch: true, Handlers: map[string]idem.Handler{"charge": h}}}
	e, err := idem.OpenFile(path, file, opts)
	require.NoError(t, err)
	obCall(t, e, "order-1", obMsg{"charge", "", "1"})
	<-entered
	require.NoError(t, e.Close(), "Close cancels the handler's context and waits for it")

	opts.Outbox = idem.OutboxOptions{}
	e, err = idem.OpenFile(path, file, opts)
	require.NoError(t, err)
	defer e.Close()
	ms := obMessages(t, e)
	require.Len(t, ms, 1, "the message is still there")
	require.Equal(t, 0, ms[0].Failures, "an attempt cut by Close does not count")
}

func TestOutboxWorkersBoundParallelHandlers(t *testing.T) {
	clock := testkit.NewClock(obStart)
	var running, peak atomic.Int32
	release := make(chan struct{})
	h := func(ctx context.Context, m idem.Message) error {
		n := running.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		<-release
		running.Add(-1)
		return nil
	}
	e, _ := obOpen(t, clock, idem.OutboxOptions{Workers: 3, Handlers: map[string]idem.Handler{"t": h}})
	for i := range 6 {
		obCall(t, e, fmt.Sprintf("k%d", i), obMsg{"t", "", ""})
	}
	testkit.Eventually(t, "three handlers running in parallel", nil, func() bool { return running.Load() == 3 })
	close(release)
	testkit.Eventually(t, "all delivered", nil, func() bool { return obStats(t, e).Delivered == 6 })
	require.Equal(t, int32(3), peak.Load())
}

// TestOutboxConcurrentEnqueueAllDelivered: 64 goroutines enqueue 10,240
// messages through 2,560 DoTx calls with distinct keys. Every message is
// delivered (at least once; here, without crashes, exactly once), to the
// handler of its topic, in enqueue order per ordering key, never two of one
// ordering key at once.
func TestOutboxConcurrentEnqueueAllDelivered(t *testing.T) {
	const goroutines, calls = 64, 40 // 4 messages per call
	clock := testkit.NewClock(obStart)

	type delivery struct {
		topic string
		m     idem.Message
	}
	var (
		mu       sync.Mutex
		got      = map[string][]delivery{} // by ordering key, in delivery order
		inFlight = map[string]bool{}
		overlap  atomic.Int32
	)
	handler := func(topic string) idem.Handler {
		return func(ctx context.Context, m idem.Message) error {
			mu.Lock()
			if inFlight[m.OrderingKey] {
				overlap.Add(1)
			}
			inFlight[m.OrderingKey] = true
			mu.Unlock()
			runtime.Gosched()
			mu.Lock()
			inFlight[m.OrderingKey] = false
			got[m.OrderingKey] = append(got[m.OrderingKey], delivery{topic, m})
			mu.Unlock()
			return nil
		}
	}
	e, _ := obOpen(t, clock, idem.OutboxOptions{Workers: 32,
		Handlers: map[string]idem.Handler{"a": handler("a"), "b": handler("b")}})

	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for c := range calls {
				key := fmt.Sprintf("g%02d-c%02d", g, c)
				shared := fmt.Sprintf("g%02d", g) // one ordering key across this goroutine's calls
				assert.NoError(t, obEnqueue(e, key,
					obMsg{"a", "", key + "/0"}, obMsg{"b", "", key + "/1"},
					obMsg{"a", shared, key + "/2"}, obMsg{"b", shared, key + "/3"}))
			}
		})
	}
	wg.Wait()
	const total = goroutines * calls * 4
	testkit.Eventually(t, "every message delivered", nil, func() bool { return obStats(t, e).Delivered == total })

	mu.Lock()
	defer mu.Unlock()
	require.Zero(t, overlap.Load(), "two messages of one ordering key ran at once")
	seen := map[string]bool{}
	for ok, ds := range got {
		for i, d := range ds {
			m := d.m
			require.Equal(t, d.topic, m.Topic, "delivered to the wrong handler")
			require.Equal(t, m.DownstreamKey, string(m.Payload), "payload and downstream key belong together")
			require.Equal(t, ok, m.OrderingKey)
			require.False(t, seen[m.DownstreamKey], "delivered twice: %s", m.DownstreamKey)
			seen[m.DownstreamKey] = true
			if i > 0 {
				require.Less(t, ds[i-1].m.Seq, m.Seq, "order per ordering key %s", ok)
			}
			if strings.HasPrefix(ok, "g") && !strings.Contains(ok, "-") {
				require.Contains(t, []int{2, 3}, m.Index)
			} else {
				require.Equal(t, i, m.Index, "order per idempotency key %s", ok)
			}
		}
	}
	require.Len(t, seen, total, "none lost")
	require.Equal(t, idem.OutboxStats{Delivered: total}, obStats(t, e))
}

func TestEnqueueRefusesInvalidMessages(t *testing.T) {
	e, _ := boltkit.OpenFile(t, &idem.BoltOptions{NoSync: true}, nil)
	for _, tc := range []struct{ name, topic, ordering string }{
		{"empty topic", "", ""},
		{"long topic", strings.Repeat("t", 256), ""},
		{"topic not UTF-8", "\xff", ""},
		{"long ordering key", "t", strings.Repeat("o", idem.MaxKeyLen+1)},
		{"ordering key not UTF-8", "t", "\xff"},
		{"topic with NUL", "t\x00", ""},
		{"ordering key with NUL", "t", "o\x00"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.DoTx(context.Background(), "k-"+tc.name, nil, func(ctx context.Context, tx *idem.Tx) ([]byte, error) {
				return nil, tx.EnqueueOrdered(tc.topic, tc.ordering, nil)
			})
			require.ErrorIs(t, err, idem.ErrInvalidMessage)
		})
	}
	require.Equal(t, 0, obStats(t, e).Pending)
}

func TestEnqueueCommitsWithTheCallOrNotAtAll(t *testing.T) {
	e, _ := boltkit.OpenFile(t, &idem.BoltOptions{NoSync: true}, nil)
	enqueueThen := func(after func() error) func(context.Context, *idem.Tx) ([]byte, error) {
		return func(ctx context.Context, tx *idem.Tx) ([]byte, error) {
			if err := tx.Enqueue("charge", []byte("1200")); err != nil {
				return nil, err
			}
			return nil, after()
		}
	}
	_, err := e.DoTx(context.Background(), "fails", nil, enqueueThen(func() error { return errors.New("out of stock") }))
	require.Error(t, err)
	_, err = e.DoTx(context.Background(), "retryable", nil, enqueueThen(func() error { return idem.Retryable(errors.New("busy")) }))
	require.ErrorIs(t, err, idem.ErrRetryable)
	require.Panics(t, func() {
		_, _ = e.DoTx(context.Background(), "panics", nil, enqueueThen(func() error { panic("boom") }))
	})
	require.Empty(t, obMessages(t, e), "nothing enqueued by a failed call")

	_, err = e.DoTx(context.Background(), "ok", nil, enqueueThen(func() error { return nil }))
	require.NoError(t, err)
	ms := obMessages(t, e)
	require.Len(t, ms, 1)
	require.Equal(t, "ok", ms[0].Key)
	require.Equal(t, 0, ms[0].Index, "the index restarts when fn runs again")

	// A Tx kept past its fn refuses to enqueue.
	var kept *idem.Tx
	_, err = e.DoTx(context.Background(), "kept", nil, func(ctx context.Context, tx *idem.Tx) ([]byte, error) {
		kept = tx
		return nil, nil
	})
	require.NoError(t, err)
	require.ErrorIs(t, kept.Enqueue("charge", nil), idem.ErrTxClosed)
}

func TestDownstreamKey(t *testing.T) {
	require.Equal(t, "order-1/0", idem.DownstreamKey("order-1", 0))
	require.Equal(t, "order-1/12", idem.DownstreamKey("order-1", 12))

	fits := strings.Repeat("k", idem.MaxKeyLen-2)
	require.Equal(t, fits+"/0", idem.DownstreamKey(fits, 0))
	require.Len(t, idem.DownstreamKey(fits, 10), 74, "over MaxKeyLen: hashed")

	long := strings.Repeat("k", idem.MaxKeyLen)
	k0, k1 := idem.DownstreamKey(long, 0), idem.DownstreamKey(long, 1)
	require.NotEqual(t, k0, k1)
	require.LessOrEqual(t, len(k0), idem.MaxKeyLen)
	require.True(t, strings.HasPrefix(k0, "sha256:") && strings.HasSuffix(k0, "/0"), k0)
	require.Equal(t, k0, idem.DownstreamKey(long, 0), "deterministic")
	require.NotEqual(t, k0, idem.DownstreamKey(long[:len(long)-1]+"j", 0))
}

func TestOutboxReadOnlyInspection(t *testing.T) {
	clock := testkit.NewClock(obStart)
	path := filepath.Join(t.TempDir(), "idem.db")
	e, err := idem.OpenFile(path, &idem.BoltOptions{NoSync: true}, &idem.Options{Now: clock.Now, PruneInterval: -1, Outbox: idem.OutboxOptions{
		Dispatch: true, PollInterval: time.Millisecond, MaxAttempts: 1,
		Handlers: map[string]idem.Handler{"charge": func(context.Context, idem.Message) error { return errors.New("declined") }},
	}})
	require.NoError(t, err)
	obCall(t, e, "order-1", obMsg{"charge", "", "1"})
	obCall(t, e, "order-2", obMsg{"email", "", "2"})
	testkit.Eventually(t, "a dead letter", nil, func() bool { return obStats(t, e).Dead == 1 })
	require.NoError(t, e.Close())

	ro, err := idem.OpenFile(path, &idem.BoltOptions{ReadOnly: true}, &idem.Options{Now: clock.Now})
	require.NoError(t, err)
	defer ro.Close()
	ms := obMessages(t, ro)
	require.Len(t, ms, 2)
	require.Equal(t, "email", ms[0].Topic)
	require.False(t, ms[0].Dead)
	require.Equal(t, "charge", ms[1].Topic)
	require.True(t, ms[1].Dead)
	require.Equal(t, "declined", ms[1].LastError)
	require.Equal(t, idem.OutboxStats{Pending: 1, Waiting: 1, Dead: 1}, obStats(t, ro))
	require.Error(t, ro.RetryDead(ms[1].Seq))
	require.Error(t, ro.DropDead(ms[1].Seq))
}
