package idemotel_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idemotel"
	"github.com/idemkit/idem/idempg"
)

// engine is what the tests need of either backend's engine.
type engine struct {
	// doer is the engine itself, for the adapters.
	doer idemcore.Doer
	do   func(ctx context.Context, key string, fp []byte, fn func(context.Context) ([]byte, error)) (idemcore.Result, error)
	dotx func(ctx context.Context, key string, fp []byte, topic string, payload []byte) (idemcore.Result, error)
	// backlog is the engine's OutboxBacklog.
	backlog func(context.Context) (idemcore.OutboxBacklog, error)
	close   func() error
}

// backend opens an engine with o on one backend; the engine is closed
// when t ends.
type backend struct {
	name string
	open func(t *testing.T, o *idemcore.Options) *engine
}

// start installs a telemetry (default options) in o and opens b's engine
// with o.
func (b backend) start(t *testing.T, o *idemcore.Options) (*telemetry, *engine) {
	t.Helper()
	tel := newTelemetry(t, o, nil)
	return tel, b.open(t, o)
}

// backends are the two: the bbolt file and Postgres (IDEM_TEST_PG; skipped
// without it, failed when CI is set).
var backends = []backend{
	{"bbolt", openBolt},
	{"postgres", openPG},
}

// openBoltAt opens a bbolt engine in dir, closed when t ends.
func openBoltAt(t *testing.T, dir string, o *idemcore.Options) *idem.Engine {
	t.Helper()
	eng, err := idem.Open(filepath.Join(dir, "idem.db"), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = eng.Close() })
	return eng
}

func openBolt(t *testing.T, o *idemcore.Options) *engine {
	t.Helper()
	eng := openBoltAt(t, t.TempDir(), o)
	return &engine{
		doer: eng,
		do:   eng.Do,
		dotx: func(ctx context.Context, key string, fp []byte, topic string, payload []byte) (idemcore.Result, error) {
			return eng.DoTx(ctx, key, fp, func(_ context.Context, tx *idem.Tx) ([]byte, error) {
				return []byte("ok"), tx.Enqueue(topic, payload)
			})
		},
		backlog: eng.OutboxBacklog,
		close:   eng.Close,
	}
}

// pgPool opens a pool on IDEM_TEST_PG and a schema of the test's own,
// migrated; both go when t ends.
func pgPool(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	dsn := os.Getenv("IDEM_TEST_PG")
	if dsn == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("CI is set and IDEM_TEST_PG is not: start the server with scripts/postgres.sh start --pgbouncer")
		}
		t.Skip(`IDEM_TEST_PG not set: eval "$(scripts/postgres.sh start --pgbouncer)" runs a local server`)
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "idem_test_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	if _, err := idempg.Migrate(ctx, pool, &idempg.Options{Schema: schema}); err != nil {
		t.Fatal(err)
	}
	return pool, schema
}

func openPG(t *testing.T, o *idemcore.Options) *engine {
	t.Helper()
	pool, schema := pgPool(t)
	eng, err := idempg.Open(context.Background(), pool, &idempg.Options{Schema: schema}, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = eng.Close() })
	return &engine{
		doer: eng,
		do:   eng.Do,
		dotx: func(ctx context.Context, key string, fp []byte, topic string, payload []byte) (idemcore.Result, error) {
			return eng.DoTx(ctx, key, fp, func(_ context.Context, tx pgx.Tx) ([]byte, error) {
				return []byte("ok"), idempg.Enqueue(tx, topic, payload)
			})
		},
		backlog: eng.OutboxBacklog,
		close:   eng.Close,
	}
}

// telemetry is a Telemetry on the SDK's in-memory exporters.
type telemetry struct {
	*idemotel.Telemetry
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
}

// newTelemetry makes a telemetry with opts (nil: defaults) and installs it
// in o.
func newTelemetry(t *testing.T, o *idemcore.Options, opts *idemotel.Options) *telemetry {
	t.Helper()
	tel := &telemetry{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	tel.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tel.spans))
	var to idemotel.Options
	if opts != nil {
		to = *opts
	}
	to.TracerProvider = tel.tp
	to.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(tel.reader))
	var err error
	if tel.Telemetry, err = idemotel.New(&to); err != nil {
		t.Fatal(err)
	}
	tel.Install(o)
	return tel
}

// ended returns the ended spans named name.
func (tel *telemetry) ended(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range tel.spans.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// one returns the only ended span named name.
func (tel *telemetry) one(t *testing.T, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	s := tel.ended(name)
	if len(s) != 1 {
		t.Fatalf("%d spans %s ended, want 1 (all: %v)", len(s), name, names(tel.spans.Ended()))
	}
	return s[0]
}

func names(spans []sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name())
	}
	return out
}

// collect reads the metrics.
func (tel *telemetry) collect(t *testing.T) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := tel.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	return rm
}

// attrs maps a span's attributes by key.
func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// metric finds the metric named name.
func findMetric(rm metricdata.ResourceMetrics, name string) (metricdata.Metrics, bool) {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m, true
			}
		}
	}
	return metricdata.Metrics{}, false
}

// sumBy sums the points of the int64 sum name by the value of key.
func sumBy(t *testing.T, rm metricdata.ResourceMetrics, name string, key attribute.Key) map[string]int64 {
	t.Helper()
	m, ok := findMetric(rm, name)
	if !ok {
		t.Fatalf("no %s", name)
	}
	out := map[string]int64{}
	for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
		v, _ := p.Attributes.Value(key)
		out[v.AsString()] += p.Value
	}
	return out
}

// spansOfKind returns the ended spans of kind k.
func (tel *telemetry) spansOfKind(k trace.SpanKind) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range tel.spans.Ended() {
		if s.SpanKind() == k {
			out = append(out, s)
		}
	}
	return out
}

// assertNesting checks two calls' traces, each the client's span → the
// server's → idem.do, the first executed with idem.fn under it and fn's own
// span named work under that, the second replayed.
func assertNesting(t *testing.T, tel *telemetry, work string) {
	t.Helper()
	servers, clients := tel.spansOfKind(trace.SpanKindServer), tel.spansOfKind(trace.SpanKindClient)
	if len(servers) != 2 || len(clients) != 2 {
		t.Fatalf("%d server and %d client spans, want 2 each (all: %v)", len(servers), len(clients), names(tel.spans.Ended()))
	}
	calls := tel.ended("idem.do")
	if len(calls) != 2 {
		t.Fatalf("%d idem.do spans, want 2", len(calls))
	}
	for i := range 2 {
		wantChild(t, clients[i], servers[i])
		wantChild(t, servers[i], calls[i])
	}
	wantAttr(t, calls[0], idemotel.AttrOutcome, "executed")
	wantAttr(t, calls[1], idemotel.AttrOutcome, "replayed")
	fn := tel.one(t, "idem.fn")
	wantChild(t, calls[0], fn)
	wantChild(t, fn, tel.one(t, work))
}

// wantChild fails unless child's parent is parent, in parent's trace.
func wantChild(t *testing.T, parent, child sdktrace.ReadOnlySpan) {
	t.Helper()
	if child.Parent().SpanID() != parent.SpanContext().SpanID() || child.SpanContext().TraceID() != parent.SpanContext().TraceID() {
		t.Errorf("%s's parent is %v in trace %v, want %s %v in trace %v", child.Name(), child.Parent().SpanID(), child.SpanContext().TraceID(),
			parent.Name(), parent.SpanContext().SpanID(), parent.SpanContext().TraceID())
	}
}

// assertNoSecret fails if any span (attribute, status, event, link) or
// metric data point attribute holds one of secrets.
func assertNoSecret(t *testing.T, tel *telemetry, secrets ...string) {
	t.Helper()
	check := func(where, v string) {
		for _, s := range secrets {
			if s != "" && strings.Contains(v, s) {
				t.Errorf("%s holds %q: %q", where, s, v)
			}
		}
	}
	kvs := func(where string, set []attribute.KeyValue) {
		for _, kv := range set {
			check(where+" "+string(kv.Key), kv.Value.Emit())
		}
	}
	for _, s := range tel.spans.Ended() {
		kvs("span "+s.Name(), s.Attributes())
		check("span "+s.Name()+" status", s.Status().Description)
		for _, ev := range s.Events() {
			check("span "+s.Name()+" event", ev.Name)
			kvs("span "+s.Name()+" event "+ev.Name, ev.Attributes)
		}
		for _, l := range s.Links() {
			kvs("span "+s.Name()+" link", l.Attributes)
		}
	}
	rm := tel.collect(t)
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			var sets []attribute.Set
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					sets = append(sets, p.Attributes)
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					sets = append(sets, p.Attributes)
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					sets = append(sets, p.Attributes)
				}
			}
			for _, set := range sets {
				kvs("metric "+m.Name, set.ToSlice())
			}
		}
	}
}

// parentCtx starts a span "request" of tel's provider, as a server would.
func (tel *telemetry) parentCtx(ctx context.Context) (context.Context, func()) {
	ctx, span := tel.tp.Tracer("test").Start(ctx, "request")
	return ctx, func() { span.End() }
}

// traceparent is the W3C traceparent of ctx's span.
func traceparent(ctx context.Context) string {
	c := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, c)
	return c["traceparent"]
}
