package idemprom_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemprom"
	"github.com/idemkit/idem/internal/testkit"
	"github.com/idemkit/idem/internal/testkit/boltkit"
)

// secret is in every key, response, payload and error of the tests: it must
// never reach a metric or a log line.
const secret = "4111-1111-1111-1111"

// syncBuffer is a log destination safe for the engine's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// exposition is the registry's metrics in the text format.
func exposition(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	var b bytes.Buffer
	enc := expfmt.NewEncoder(&b, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		require.NoError(t, enc.Encode(mf))
	}
	return b.String()
}

// histogramCount is the sample count of the histogram name in reg.
func histogramCount(t *testing.T, reg *prometheus.Registry, name string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			require.Len(t, mf.GetMetric(), 1)
			return mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

func TestCollectorCountsAnEngine(t *testing.T) {
	c := idemprom.New(&idemprom.Options{ConstLabels: prometheus.Labels{"db": "orders"}})
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(c))
	logs := &syncBuffer{}
	clock := testkit.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	e, _ := boltkit.OpenFile(t, &idem.BoltOptions{NoSync: true}, &idem.Options{
		Now: clock.Now, PruneInterval: -1, Observer: c, InFlight: idem.InFlightFail,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Outbox: idem.OutboxOptions{
			Dispatch: true, PollInterval: time.Millisecond, MaxAttempts: 1,
			Handlers: map[string]idem.Handler{
				"email": func(context.Context, idem.Message) error { return nil },
				"charge": func(_ context.Context, m idem.Message) error {
					return errors.New("card " + secret + " declined for " + m.Key)
				},
				"panics": func(context.Context, idem.Message) error { panic("panic with " + secret) },
			},
		},
	})
	bg := context.Background()
	key := "order-" + secret
	resp := []byte("response " + secret)

	_, err := e.Do(bg, key, []byte("a"), func(context.Context) ([]byte, error) { return resp, nil })
	require.NoError(t, err)
	_, err = e.Do(bg, key, []byte("a"), func(context.Context) ([]byte, error) { return resp, nil })
	require.NoError(t, err, "a replay")
	_, err = e.Do(bg, key, []byte("other"), func(context.Context) ([]byte, error) { return resp, nil })
	require.ErrorIs(t, err, idem.ErrFingerprintMismatch)
	_, err = e.Do(bg, "fails-"+secret, nil, func(context.Context) ([]byte, error) {
		return nil, errors.New("permanent " + secret)
	})
	require.Error(t, err)

	// A duplicate refused while the first call runs.
	running, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := e.Do(bg, "slow-"+secret, nil, func(context.Context) ([]byte, error) {
			close(running)
			<-release
			return resp, nil
		})
		done <- err
	}()
	<-running
	_, err = e.Do(bg, "slow-"+secret, nil, func(context.Context) ([]byte, error) { return nil, nil })
	require.ErrorIs(t, err, idem.ErrInProgress)
	close(release)
	require.NoError(t, <-done)

	// An interrupted execution, then its recovery.
	func() {
		defer func() { require.NotNil(t, recover()) }()
		_, _ = e.Do(bg, "crash-"+secret, nil, func(context.Context) ([]byte, error) { panic("crash " + secret) })
	}()
	_, err = e.Do(bg, "crash-"+secret, nil, func(context.Context) ([]byte, error) { return resp, nil })
	require.NoError(t, err)

	// Outbox: one delivery, two dead letters (a failure, a panic).
	_, err = e.DoTx(bg, "tx-"+secret, []byte(secret), func(_ context.Context, tx *idem.Tx) ([]byte, error) {
		for _, topic := range []string{"email", "charge", "panics"} {
			if err := tx.Enqueue(topic, []byte("payload "+secret)); err != nil {
				return nil, err
			}
		}
		return resp, nil
	})
	require.NoError(t, err)
	deadline := time.Now().Add(10 * time.Second)
	for {
		s, err := e.ScanFile()
		require.NoError(t, err)
		// The dispatcher reports a delivery or a dead letter to the
		// Observer after its commit, so the file shows it first: wait for
		// the metrics too.
		if s.Outbox.Dead == 2 && s.Outbox.Delivered == 1 &&
			strings.Count(exposition(t, reg), "idem_outbox_dead_letters_total{") == 2 &&
			strings.Contains(exposition(t, reg), `idem_outbox_deliveries_total{db="orders",topic="email"} 1`) {
			break
		}
		require.False(t, time.Now().After(deadline), "outbox: %+v", s.Outbox)
		time.Sleep(time.Millisecond)
	}

	clock.Advance(2 * idem.DefaultRetention)
	pruned, err := e.Prune(bg)
	require.NoError(t, err)
	require.Equal(t, 5, pruned)

	expected := `
# HELP idem_executions_total Executions of fn, by operation; recovered="true" re-executes an interrupted execution.
# TYPE idem_executions_total counter
idem_executions_total{db="orders",op="do",recovered="false"} 4
idem_executions_total{db="orders",op="do",recovered="true"} 1
idem_executions_total{db="orders",op="dotx",recovered="false"} 1
idem_executions_total{db="orders",op="dotx",recovered="true"} 0
# HELP idem_replays_total Calls answered from a done record without running fn.
# TYPE idem_replays_total counter
idem_replays_total{db="orders",op="do"} 1
idem_replays_total{db="orders",op="dotx"} 0
# HELP idem_conflicts_total Calls refused because the key was reused with another fingerprint.
# TYPE idem_conflicts_total counter
idem_conflicts_total{db="orders",op="do"} 1
idem_conflicts_total{db="orders",op="dotx"} 0
# HELP idem_in_progress_total Duplicates refused while the call with their key ran (InFlightFail).
# TYPE idem_in_progress_total counter
idem_in_progress_total{db="orders",op="do"} 1
idem_in_progress_total{db="orders",op="dotx"} 0
# HELP idem_waits_total Duplicates that waited for the running call with their key.
# TYPE idem_waits_total counter
idem_waits_total{db="orders",op="do"} 0
idem_waits_total{db="orders",op="dotx"} 0
# HELP idem_pruned_records_total Expired records removed by the pruner.
# TYPE idem_pruned_records_total counter
idem_pruned_records_total{db="orders"} 5
# HELP idem_outbox_deliveries_total Outbox messages delivered and removed, by topic.
# TYPE idem_outbox_deliveries_total counter
idem_outbox_deliveries_total{db="orders",topic="email"} 1
# HELP idem_outbox_delivery_failures_total Failed outbox delivery attempts, by topic.
# TYPE idem_outbox_delivery_failures_total counter
idem_outbox_delivery_failures_total{db="orders",topic="charge"} 1
idem_outbox_delivery_failures_total{db="orders",topic="panics"} 1
# HELP idem_outbox_dead_letters_total Outbox messages that became dead letters, by topic.
# TYPE idem_outbox_dead_letters_total counter
idem_outbox_dead_letters_total{db="orders",topic="charge"} 1
idem_outbox_dead_letters_total{db="orders",topic="panics"} 1
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(expected),
		"idem_executions_total", "idem_replays_total", "idem_conflicts_total", "idem_in_progress_total",
		"idem_waits_total", "idem_pruned_records_total", "idem_outbox_deliveries_total",
		"idem_outbox_delivery_failures_total", "idem_outbox_dead_letters_total"))

	s := e.Stats()
	require.Equal(t, s.Commits, histogramCount(t, reg, "idem_commit_batch_size"), "one observation per commit")
	require.Equal(t, s.Commits, histogramCount(t, reg, "idem_commit_duration_seconds"))
	require.Equal(t, uint64(1), histogramCount(t, reg, "idem_prune_duration_seconds"))
	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	require.Empty(t, problems, "promlint")

	text := exposition(t, reg)
	require.NotContains(t, text, secret, "no key, response, payload or error text in a metric")
	require.NotContains(t, text, "order-")
	require.NotEmpty(t, logs.String(), "the engine logged at debug level (the recovery at least)")
	require.NotContains(t, logs.String(), secret, "no key, response, payload or error text in a log line")
}

func TestCollectorWaits(t *testing.T) {
	c := idemprom.New(nil)
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(c))
	e, _ := boltkit.OpenFile(t, &idem.BoltOptions{NoSync: true}, &idem.Options{Observer: c})
	running, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 2)
	go func() {
		_, err := e.Do(context.Background(), "k", nil, func(context.Context) ([]byte, error) {
			close(running)
			<-release
			return nil, nil
		})
		done <- err
	}()
	<-running
	go func() {
		_, err := e.Do(context.Background(), "k", nil, func(context.Context) ([]byte, error) { return nil, nil })
		done <- err
	}()
	want := `
# HELP idem_waits_total Duplicates that waited for the running call with their key.
# TYPE idem_waits_total counter
idem_waits_total{op="do"} 1
idem_waits_total{op="dotx"} 0
`
	deadline := time.Now().Add(10 * time.Second)
	for testutil.GatherAndCompare(reg, strings.NewReader(want), "idem_waits_total") != nil {
		require.False(t, time.Now().After(deadline), "the duplicate never waited")
		time.Sleep(time.Millisecond)
	}
	close(release)
	require.NoError(t, <-done)
	require.NoError(t, <-done)
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want), "idem_waits_total"), "one wait, counted once")
}
