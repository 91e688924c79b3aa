// Package idemprom exposes an idem engine's events as Prometheus metrics: a
// Collector that is both an idemcore.Observer (set it as Options.Observer) and a
// prometheus.Collector (register it).
//
//	c := idemprom.New(nil)
//	prometheus.MustRegister(c)
//	e, err := idem.Open("idem.db", &idem.Options{Observer: c})
//
// The metrics, with the default namespace "idem":
//
//	idem_executions_total{op,recovered}        fn started ("do", "dotx"; recovered="true" re-executes an interrupted execution)
//	idem_replays_total{op}                     calls answered from a done record
//	idem_conflicts_total{op}                   calls refused for a fingerprint mismatch (HTTP 422)
//	idem_waits_total{op}                       duplicates that waited for the running call
//	idem_in_progress_total{op}                 duplicates refused with ErrInProgress (HTTP 409)
//	idem_commit_batch_size                     histogram: writes per commit (group commit)
//	idem_commit_duration_seconds               histogram: bbolt Commit, fsync included
//	idem_pruned_records_total                  records removed by the pruner
//	idem_prune_duration_seconds                histogram: prune runs
//	idem_outbox_deliveries_total{topic}        messages delivered and removed
//	idem_outbox_delivery_failures_total{topic} failed delivery attempts
//	idem_outbox_dead_letters_total{topic}      messages that became dead letters
//
// No label ever holds an idempotency key, a response, a payload or an
// error's text: the labels are the operation, a recovered flag and the outbox
// topic, which is a name the program chooses (keep topics few and fixed:
// each is a series). The package logs nothing.
package idemprom

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idem/idemcore"
)

// Options configure New. A nil *Options means the defaults.
type Options struct {
	// Namespace prefixes every metric name. Empty means "idem".
	Namespace string
	// ConstLabels are added to every metric, for example {"db": "orders"}
	// when one registry collects several engines (each with its own
	// Collector). They must not hold keys or other user data.
	ConstLabels prometheus.Labels
}

// Collector counts an engine's events. Its Observe is safe for concurrent use
// and does not block; Describe and Collect make it a prometheus.Collector.
// One Collector observes one engine (or several, summed).
type Collector struct {
	executions, replays, conflicts, waits, inProgress *prometheus.CounterVec

	commitBatch, commitSeconds, pruneSeconds prometheus.Histogram
	pruned                                   prometheus.Counter

	deliveries, failures, dead *prometheus.CounterVec

	// The op-labelled series, resolved once: Observe on a call's hot path
	// does no label lookup.
	do, dotx opSeries
}

// opSeries are the series of one operation.
type opSeries struct {
	executions, recovered, replays, conflicts, waits, inProgress prometheus.Counter
}

var (
	_ idemcore.Observer    = (*Collector)(nil)
	_ prometheus.Collector = (*Collector)(nil)
)

// New returns a Collector with no observations yet.
func New(opts *Options) *Collector {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Namespace == "" {
		o.Namespace = "idem"
	}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: o.Namespace, Name: name, Help: help, ConstLabels: o.ConstLabels}, labels)
	}
	histogram := func(name, help string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: o.Namespace, Name: name, Help: help, ConstLabels: o.ConstLabels, Buckets: buckets})
	}
	c := &Collector{
		executions: counter("executions_total", "Executions of fn, by operation; recovered=\"true\" re-executes an interrupted execution.", "op", "recovered"),
		replays:    counter("replays_total", "Calls answered from a done record without running fn.", "op"),
		conflicts:  counter("conflicts_total", "Calls refused because the key was reused with another fingerprint.", "op"),
		waits:      counter("waits_total", "Duplicates that waited for the running call with their key.", "op"),
		inProgress: counter("in_progress_total", "Duplicates refused while the call with their key ran (InFlightFail).", "op"),
		commitBatch: histogram("commit_batch_size", "Writes carried by one commit (group commit).",
			prometheus.ExponentialBuckets(1, 2, 10)),
		commitSeconds: histogram("commit_duration_seconds", "Time of a bbolt commit, fsync included.",
			prometheus.ExponentialBuckets(0.0001, 2, 16)),
		deliveries: counter("outbox_deliveries_total", "Outbox messages delivered and removed, by topic.", "topic"),
		failures:   counter("outbox_delivery_failures_total", "Failed outbox delivery attempts, by topic.", "topic"),
		dead:       counter("outbox_dead_letters_total", "Outbox messages that became dead letters, by topic.", "topic"),
	}
	c.pruned = prometheus.NewCounter(prometheus.CounterOpts{Namespace: o.Namespace, Name: "pruned_records_total",
		Help: "Expired records removed by the pruner.", ConstLabels: o.ConstLabels})
	c.pruneSeconds = histogram("prune_duration_seconds", "Time of one prune run.", prometheus.ExponentialBuckets(0.001, 4, 10))
	c.do, c.dotx = c.series("do"), c.series("dotx")
	return c
}

func (c *Collector) series(op string) opSeries {
	return opSeries{
		executions: c.executions.WithLabelValues(op, "false"),
		recovered:  c.executions.WithLabelValues(op, "true"),
		replays:    c.replays.WithLabelValues(op),
		conflicts:  c.conflicts.WithLabelValues(op),
		waits:      c.waits.WithLabelValues(op),
		inProgress: c.inProgress.WithLabelValues(op),
	}
}

// ops returns the series of op; an operation this package does not know
// yet is counted with the "do" ones rather than made a label of.
func (c *Collector) ops(op string) *opSeries {
	if op == "dotx" {
		return &c.dotx
	}
	return &c.do
}

// Observe counts ev: idemcore.Observer.
func (c *Collector) Observe(ev idemcore.Event) {
	switch ev.Kind {
	case idemcore.EventExecution:
		s := c.ops(ev.Op)
		if ev.N > 1 {
			s.recovered.Inc()
		} else {
			s.executions.Inc()
		}
	case idemcore.EventReplay:
		c.ops(ev.Op).replays.Inc()
	case idemcore.EventConflict:
		c.ops(ev.Op).conflicts.Inc()
	case idemcore.EventWait:
		c.ops(ev.Op).waits.Inc()
	case idemcore.EventInProgress:
		c.ops(ev.Op).inProgress.Inc()
	case idemcore.EventCommit:
		c.commitBatch.Observe(float64(ev.N))
		c.commitSeconds.Observe(ev.Duration.Seconds())
	case idemcore.EventPrune:
		c.pruned.Add(float64(ev.N))
		c.pruneSeconds.Observe(ev.Duration.Seconds())
	case idemcore.EventDelivery:
		c.deliveries.WithLabelValues(ev.Topic).Inc()
	case idemcore.EventDeliveryFailed:
		c.failures.WithLabelValues(ev.Topic).Inc()
	case idemcore.EventDeadLetter:
		c.dead.WithLabelValues(ev.Topic).Inc()
	}
}

// collectors are the metrics, for Describe and Collect.
func (c *Collector) collectors() []prometheus.Collector {
	return []prometheus.Collector{c.executions, c.replays, c.conflicts, c.waits, c.inProgress,
		c.commitBatch, c.commitSeconds, c.pruned, c.pruneSeconds, c.deliveries, c.failures, c.dead}
}

// Describe sends the descriptors of every metric: prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range c.collectors() {
		m.Describe(ch)
	}
}

// Collect sends the current value of every metric: prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	for _, m := range c.collectors() {
		m.Collect(ch)
	}
}
