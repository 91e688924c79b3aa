package idemotel

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem/idemcore"
)

// ScopeName is the instrumentation scope of idemotel's tracer and meter.
const ScopeName = "github.com/idemkit/idem/idemotel"

// Attribute keys of idem's own (the ones OpenTelemetry's semantic
// conventions have no name for).
const (
	// AttrOutcome is a call's idemcore.CallOutcome ("executed",
	// "recovered", "replayed", "waited", "refused", "failed") or a delivery
	// attempt's idemcore.DeliveryOutcome ("delivered", "retry",
	// "dead_letter", "abandoned").
	AttrOutcome = attribute.Key("idem.outcome")
	// AttrOperation is "do" or "dotx".
	AttrOperation = attribute.Key("idem.operation")
	// AttrAttempt is the execution's attempt number (1 for a new key), or
	// the delivery attempt's.
	AttrAttempt = attribute.Key("idem.attempt")
	// AttrBackend is the backend's name: "bbolt", "postgres".
	AttrBackend = attribute.Key("idem.backend")
	// AttrRecovered is set on fn's span when it re-executes an interrupted
	// execution.
	AttrRecovered = attribute.Key("idem.recovered")
	// AttrRun counts a DoTx fn's runs in one call (bbolt's group commit
	// with its journal off may run it up to 3 times).
	AttrRun = attribute.Key("idem.fn.run")
	// AttrStoredError is set on a call answered with a recorded error of
	// fn's (first or replayed): an answer, not a failure of the engine.
	AttrStoredError = attribute.Key("idem.stored_error")
	// AttrKeyHash is the HMAC-SHA256 of the idempotency key (hex, its first
	// 16 bytes), only with Options.KeyHashSecret.
	AttrKeyHash = attribute.Key("idem.key.hash")
	// AttrDeadLetter is set on a delivery attempt after which the message
	// is a dead letter.
	AttrDeadLetter = attribute.Key("idem.dead_letter")
	// AttrWaitSeconds is the time a call waited for another with its key,
	// in seconds.
	AttrWaitSeconds = attribute.Key("idem.wait.duration")
)

// Semantic-convention keys used as they are defined
// (https://opentelemetry.io/docs/specs/semconv/).
const (
	attrErrorType        = attribute.Key("error.type")
	attrMessagingSystem  = attribute.Key("messaging.system")
	attrMessagingOpType  = attribute.Key("messaging.operation.type")
	attrMessagingOpName  = attribute.Key("messaging.operation.name")
	attrMessagingDest    = attribute.Key("messaging.destination.name")
	attrMessagingMsgID   = attribute.Key("messaging.message.id")
	attrMessagingAttempt = attribute.Key("messaging.message.delivery_attempt")
)

// Options configure a Telemetry. The zero value of every field means its
// default; a nil *Options means all defaults.
type Options struct {
	// TracerProvider makes the spans. Nil means otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// MeterProvider makes the instruments. Nil means otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// KeyHashSecret, if not empty, adds AttrKeyHash to each call's span:
	// the HMAC-SHA256 of the idempotency key under this secret, so that the
	// spans of one key can be found without the key itself being exported
	// (keys may carry user data). Empty (the default): no attribute names
	// the key in any form.
	KeyHashSecret []byte
}

// Telemetry is an idemcore.Tracer and an idemcore.Observer that report to
// OpenTelemetry: spans idem.do, idem.dotx (a child of the caller's span in
// ctx), idem.fn (a child of the call's) and idem.deliver (one per outbox
// delivery attempt, linked to the span of the call that enqueued the
// message), and the metrics listed in the package documentation. Install
// sets it in an engine's Options. Safe for concurrent use.
type Telemetry struct {
	tracer trace.Tracer
	meter  metric.Meter
	secret []byte
	prop   propagation.TraceContext

	mu         sync.Mutex
	backlogReg metric.Registration

	calls       metric.Int64Counter
	callDur     metric.Float64Histogram
	fnDur       metric.Float64Histogram
	waitDur     metric.Float64Histogram
	commitDur   metric.Float64Histogram
	active      metric.Int64UpDownCounter
	deliveries  metric.Int64Counter
	deliveryDur metric.Float64Histogram
	deadLetters metric.Int64Counter
	pruned      metric.Int64Counter

	// callSets are the attribute sets of a call's metrics without an
	// error.type, by operation (0: do, 1: dotx) and outcome; opSets by
	// operation alone. Made once, so that a call's measurements allocate
	// nothing for their attributes.
	callSets [2][outcomes]*attrOpts
	opSets   [2]*attrOpts
	// sets holds the others (with an error.type, a delivery's topic), made
	// at their first use.
	sets sync.Map // setKey → *attrOpts

	callStart, fnStart []trace.SpanStartOption
}

var (
	_ idemcore.Tracer   = (*Telemetry)(nil)
	_ idemcore.Observer = (*Telemetry)(nil)
)

// New makes a Telemetry: its tracer and its instruments, from opts's
// providers. The error is the meter's, if an instrument cannot be made.
func New(opts *Options) (*Telemetry, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.TracerProvider == nil {
		o.TracerProvider = otel.GetTracerProvider()
	}
	if o.MeterProvider == nil {
		o.MeterProvider = otel.GetMeterProvider()
	}
	m := o.MeterProvider.Meter(ScopeName)
	t := &Telemetry{tracer: o.TracerProvider.Tracer(ScopeName), meter: m, secret: append([]byte(nil), o.KeyHashSecret...)}
	secs := []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}
	var errs []error
	must := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	var err error
	t.calls, err = m.Int64Counter("idem.calls", metric.WithUnit("{call}"),
		metric.WithDescription("Calls of Do and DoTx, by operation and outcome."))
	must(err)
	t.callDur, err = m.Float64Histogram("idem.call.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of calls of Do and DoTx, by operation and outcome."), metric.WithExplicitBucketBoundaries(secs...))
	must(err)
	t.fnDur, err = m.Float64Histogram("idem.fn.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of each run of fn."), metric.WithExplicitBucketBoundaries(secs...))
	must(err)
	t.waitDur, err = m.Float64Histogram("idem.wait.duration", metric.WithUnit("s"),
		metric.WithDescription("Time a call waited for the call in progress with its idempotency key."), metric.WithExplicitBucketBoundaries(secs...))
	must(err)
	t.commitDur, err = m.Float64Histogram("idem.commit.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of the backend's write commits (bbolt: fsync included)."), metric.WithExplicitBucketBoundaries(secs...))
	must(err)
	t.active, err = m.Int64UpDownCounter("idem.call.active", metric.WithUnit("{call}"),
		metric.WithDescription("Calls of Do and DoTx in progress (waiting duplicates included)."))
	must(err)
	t.deliveries, err = m.Int64Counter("idem.outbox.deliveries", metric.WithUnit("{attempt}"),
		metric.WithDescription("Outbox delivery attempts, by topic and outcome."))
	must(err)
	t.deliveryDur, err = m.Float64Histogram("idem.outbox.delivery.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of outbox delivery attempts."), metric.WithExplicitBucketBoundaries(secs...))
	must(err)
	t.deadLetters, err = m.Int64Counter("idem.outbox.dead_lettered", metric.WithUnit("{message}"),
		metric.WithDescription("Outbox messages that became dead letters (failed their last attempt, or failed to decode)."))
	must(err)
	t.pruned, err = m.Int64Counter("idem.pruned", metric.WithUnit("{record}"),
		metric.WithDescription("Expired records deleted by the pruner."))
	must(err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	for i, op := range []string{"do", "dotx"} {
		t.opSets[i] = newAttrOpts(AttrOperation.String(op))
		for o := idemcore.OutcomeExecuted; o <= idemcore.OutcomeFailed; o++ {
			t.callSets[i][o] = newAttrOpts(AttrOperation.String(op), AttrOutcome.String(o.String()))
		}
	}
	t.callStart = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal)}
	t.fnStart = t.callStart
	return t, nil
}

// Install sets t as o's Tracer and Observer. An Observer already set (say
// idemprom's) keeps receiving every event: both get them.
func (t *Telemetry) Install(o *idemcore.Options) {
	o.Tracer = t
	if o.Observer != nil && o.Observer != idemcore.Observer(t) {
		o.Observer = observers{o.Observer, t}
	} else {
		o.Observer = t
	}
}

// ObserveBacklog reports the gauges idem.outbox.backlog and
// idem.outbox.dead_letters {message}, read by calling read at each
// collection of the metrics: pass the engine's OutboxBacklog method
// (idem.Engine's, idempg.Engine's), once it is open. What a reading costs is
// the backend's: bbolt walks the outbox's pages in a read transaction;
// Postgres counts idem_outbox and idem_dead_letters in one statement, a scan
// that grows with the backlog, once per collection interval (a
// PeriodicReader's, 60 s by default), never per call. A later call replaces
// the reader; Close ends the reading. The error is the meter's.
func (t *Telemetry) ObserveBacklog(read func(context.Context) (idemcore.OutboxBacklog, error)) error {
	backlog, err := t.meter.Int64ObservableGauge("idem.outbox.backlog", metric.WithUnit("{message}"),
		metric.WithDescription("Outbox messages pending delivery, read from the store at each collection."))
	if err != nil {
		return err
	}
	dead, err := t.meter.Int64ObservableGauge("idem.outbox.dead_letters", metric.WithUnit("{message}"),
		metric.WithDescription("Dead letters stored, read from the store at each collection."))
	if err != nil {
		return err
	}
	reg, err := t.meter.RegisterCallback(func(ctx context.Context, ob metric.Observer) error {
		n, err := read(ctx)
		if err != nil {
			return err
		}
		ob.ObserveInt64(backlog, n.Pending)
		ob.ObserveInt64(dead, n.Dead)
		return nil
	}, backlog, dead)
	if err != nil {
		return err
	}
	t.mu.Lock()
	old := t.backlogReg
	t.backlogReg = reg
	t.mu.Unlock()
	if old != nil {
		return old.Unregister()
	}
	return nil
}

// Close ends the backlog's reading (ObserveBacklog), so that the meter stops
// reading an engine that is closing: call it before the engine's Close. The
// spans and the other instruments keep working.
func (t *Telemetry) Close() error {
	t.mu.Lock()
	reg := t.backlogReg
	t.backlogReg = nil
	t.mu.Unlock()
	if reg != nil {
		return reg.Unregister()
	}
	return nil
}

// observers hands each event to both.
type observers [2]idemcore.Observer

func (o observers) Observe(ev idemcore.Event) {
	o[0].Observe(ev)
	o[1].Observe(ev)
}

// setKey names a cached attribute set.
type setKey struct {
	kind    uint8 // 1: call, 2: delivery
	op      string
	outcome uint8
	errType string
}

// outcomes bounds idemcore.CallOutcome's and DeliveryOutcome's values.
const outcomes = 8

// attrOpts are one attribute set's options, as Add and Record take them
// (passed as slices made once, so that a measurement allocates nothing).
type attrOpts struct {
	add []metric.AddOption
	rec []metric.RecordOption
}

func newAttrOpts(kv ...attribute.KeyValue) *attrOpts {
	o := metric.WithAttributeSet(attribute.NewSet(kv...))
	return &attrOpts{add: []metric.AddOption{o}, rec: []metric.RecordOption{o}}
}

// opIndex is op's index in callSets and opSets.
func opIndex(op string) int {
	if op == "dotx" {
		return 1
	}
	return 0
}

// measure returns the attribute set k names, made once.
func (t *Telemetry) measure(k setKey, build func() []attribute.KeyValue) *attrOpts {
	if v, ok := t.sets.Load(k); ok {
		return v.(*attrOpts)
	}
	v, _ := t.sets.LoadOrStore(k, newAttrOpts(build()...))
	return v.(*attrOpts)
}

// spanName is the call span's name for op.
func spanName(op string) string {
	if op == "dotx" {
		return "idem.dotx"
	}
	return "idem.do"
}

// StartCall implements idemcore.Tracer: a span idem.do or idem.dotx, a
// child of ctx's span.
func (t *Telemetry) StartCall(ctx context.Context, s idemcore.CallStart) context.Context {
	ctx, span := t.tracer.Start(ctx, spanName(s.Op), t.callStart...)
	if span.IsRecording() {
		span.SetAttributes(AttrOperation.String(s.Op), AttrBackend.String(s.Backend))
		if len(t.secret) > 0 {
			span.SetAttributes(AttrKeyHash.String(t.keyHash(s.Key)))
		}
	}
	t.active.Add(ctx, 1, t.opSets[opIndex(s.Op)].add...)
	return ctx
}

// keyHash is the hex of the first 16 bytes of key's HMAC-SHA256.
func (t *Telemetry) keyHash(key string) string {
	h := hmac.New(sha256.New, t.secret)
	h.Write([]byte(key))
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// EndCall implements idemcore.Tracer: the outcome on the call's span, an
// error status only for the engine's own failure, and the call's metrics.
func (t *Telemetry) EndCall(ctx context.Context, e idemcore.CallEnd) {
	span := trace.SpanFromContext(ctx)
	et := ""
	if e.Err != nil || e.Panicked {
		et = errorType(e.Err, e.Panicked)
	}
	if span.IsRecording() {
		attrs := []attribute.KeyValue{AttrOutcome.String(e.Outcome.String())}
		if e.Attempt > 0 {
			attrs = append(attrs, AttrAttempt.Int(e.Attempt))
		}
		if e.Wait > 0 {
			attrs = append(attrs, AttrWaitSeconds.Float64(e.Wait.Seconds()))
		}
		var stored *idemcore.Error
		switch {
		case e.Err != nil && !e.EngineFailed && errors.As(e.Err, &stored):
			attrs = append(attrs, AttrStoredError.Bool(true))
		case et != "":
			attrs = append(attrs, attrErrorType.String(et))
		}
		span.SetAttributes(attrs...)
		if e.EngineFailed {
			span.SetStatus(codes.Error, et) // the sentinel's name: never the error's text
		}
	}
	span.End()
	if et != "" && errTypeOfStored(e) {
		et = "" // a recorded answer: not an error class of the call
	}
	op := opIndex(e.Op)
	var set *attrOpts
	if et == "" && e.Outcome < outcomes {
		set = t.callSets[op][e.Outcome]
	} else {
		set = t.measure(setKey{kind: 1, op: e.Op, outcome: uint8(e.Outcome), errType: et}, func() []attribute.KeyValue {
			return []attribute.KeyValue{AttrOperation.String(e.Op), AttrOutcome.String(e.Outcome.String()), attrErrorType.String(et)}
		})
	}
	t.calls.Add(ctx, 1, set.add...)
	t.callDur.Record(ctx, e.Duration.Seconds(), set.rec...)
	if e.Wait > 0 {
		t.waitDur.Record(ctx, e.Wait.Seconds(), t.opSets[op].rec...)
	}
	t.active.Add(ctx, -1, t.opSets[op].add...)
}

// errTypeOfStored reports whether e's error is a recorded answer of fn's.
func errTypeOfStored(e idemcore.CallEnd) bool {
	var stored *idemcore.Error
	return !e.EngineFailed && errors.As(e.Err, &stored)
}

// StartFn implements idemcore.Tracer: a span idem.fn, a child of the
// call's; fn's own spans are its children.
func (t *Telemetry) StartFn(ctx context.Context, s idemcore.FnStart) context.Context {
	ctx, span := t.tracer.Start(ctx, "idem.fn", t.fnStart...)
	if span.IsRecording() {
		attrs := []attribute.KeyValue{AttrOperation.String(s.Op), AttrAttempt.Int(s.Attempt)}
		if s.Recovered {
			attrs = append(attrs, AttrRecovered.Bool(true))
		}
		if s.Run > 1 {
			attrs = append(attrs, AttrRun.Int(s.Run))
		}
		span.SetAttributes(attrs...)
	}
	return ctx
}

// EndFn implements idemcore.Tracer: fn's error, if any, as an error status
// with its class only (error.type), never its text.
func (t *Telemetry) EndFn(ctx context.Context, e idemcore.FnEnd) {
	span := trace.SpanFromContext(ctx)
	if (e.Err != nil || e.Panicked) && span.IsRecording() {
		et := errorType(e.Err, e.Panicked)
		span.SetAttributes(attrErrorType.String(et))
		span.SetStatus(codes.Error, et)
	}
	span.End()
	t.fnDur.Record(ctx, e.Duration.Seconds())
}

// StartDelivery implements idemcore.Tracer: a span idem.deliver (kind
// consumer, messaging "process") for one attempt, in the dispatcher's
// context, linked to the span of the call that enqueued the message (from
// the trace context stored with it).
func (t *Telemetry) StartDelivery(ctx context.Context, s idemcore.DeliveryStart) context.Context {
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}
	if sc := t.parseTrace(s.Trace); sc.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
	}
	ctx, span := t.tracer.Start(ctx, "idem.deliver", opts...)
	if span.IsRecording() {
		span.SetAttributes(attrMessagingSystem.String("idem"), attrMessagingOpType.String("process"),
			attrMessagingOpName.String("deliver"), attrMessagingDest.String(s.Topic),
			attrMessagingMsgID.String(strconv.FormatUint(s.Seq, 10)), attrMessagingAttempt.Int(s.Attempt),
			AttrAttempt.Int(s.Attempt), AttrBackend.String(s.Backend))
	}
	return context.WithValue(ctx, topicKey{}, s.Topic)
}

type topicKey struct{}

// EndDelivery implements idemcore.Tracer: the attempt's outcome, an error
// status when the handler failed (its class only), and the delivery
// metrics.
func (t *Telemetry) EndDelivery(ctx context.Context, e idemcore.DeliveryEnd) {
	span := trace.SpanFromContext(ctx)
	if span.IsRecording() {
		attrs := []attribute.KeyValue{AttrOutcome.String(e.Outcome.String())}
		if e.Outcome == idemcore.DeliveryDeadLetter {
			attrs = append(attrs, AttrDeadLetter.Bool(true))
		}
		if e.Err != nil {
			et := errorType(e.Err, false)
			attrs = append(attrs, attrErrorType.String(et))
			span.SetStatus(codes.Error, et)
		}
		span.SetAttributes(attrs...)
	}
	span.End()
	topic, _ := ctx.Value(topicKey{}).(string)
	set := t.measure(setKey{kind: 2, op: topic, outcome: uint8(e.Outcome)}, func() []attribute.KeyValue {
		return []attribute.KeyValue{attrMessagingDest.String(topic), AttrOutcome.String(e.Outcome.String())}
	})
	t.deliveries.Add(ctx, 1, set.add...)
	t.deliveryDur.Record(ctx, e.Duration.Seconds(), set.rec...)
}

// MessageTrace implements idemcore.Tracer: the W3C traceparent of ctx's
// span, then, if ctx has one, a newline and its tracestate. Nil for a
// context without a valid span.
func (t *Telemetry) MessageTrace(ctx context.Context) []byte {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	c := propagation.MapCarrier{}
	t.prop.Inject(ctx, c)
	tp := c["traceparent"]
	if tp == "" {
		return nil
	}
	if ts := c["tracestate"]; ts != "" {
		return []byte(tp + "\n" + ts)
	}
	return []byte(tp)
}

// parseTrace reads a Message.Trace that MessageTrace wrote; the zero
// SpanContext if it cannot.
func (t *Telemetry) parseTrace(b []byte) trace.SpanContext {
	if len(b) == 0 {
		return trace.SpanContext{}
	}
	tp, ts, _ := strings.Cut(string(b), "\n")
	c := propagation.MapCarrier{"traceparent": tp}
	if ts != "" {
		c["tracestate"] = ts
	}
	return trace.SpanContextFromContext(t.prop.Extract(context.Background(), c))
}

// Observe implements idemcore.Observer, for what the Tracer's hooks do not
// see: commits (idem.commit.duration), pruning (idem.pruned) and dead
// letters (idem.outbox.dead_lettered, those quarantined for failing to
// decode included). The other events are counted from the hooks.
func (t *Telemetry) Observe(ev idemcore.Event) {
	ctx := context.Background()
	switch ev.Kind {
	case idemcore.EventCommit:
		t.commitDur.Record(ctx, ev.Duration.Seconds())
	case idemcore.EventPrune:
		if ev.N > 0 {
			t.pruned.Add(ctx, int64(ev.N))
		}
	case idemcore.EventDeadLetter:
		t.deadLetters.Add(ctx, 1)
	}
}

// sentinels name the engine's errors for error.type.
var sentinels = []struct {
	err  error
	name string
}{
	{idemcore.ErrInvalidKey, "ErrInvalidKey"},
	{idemcore.ErrFingerprintMismatch, "ErrFingerprintMismatch"},
	{idemcore.ErrInProgress, "ErrInProgress"},
	{idemcore.ErrIncomplete, "ErrIncomplete"},
	{idemcore.ErrReentrant, "ErrReentrant"},
	{idemcore.ErrClosed, "ErrClosed"},
	{idemcore.ErrResponseTooLarge, "ErrResponseTooLarge"},
	{idemcore.ErrStorageFailed, "ErrStorageFailed"},
	{idemcore.ErrFileFull, "ErrFileFull"},
	{idemcore.ErrCorrupt, "ErrCorrupt"},
	{idemcore.ErrLeaseLost, "ErrLeaseLost"},
	{idemcore.ErrFenced, "ErrFenced"},
	{idemcore.ErrRetryable, "ErrRetryable"},
	{idemcore.ErrGoexit, "ErrGoexit"},
	{context.Canceled, "context.Canceled"},
	{context.DeadlineExceeded, "context.DeadlineExceeded"},
}

// errorType is error.type for err: the name of the engine's sentinel it
// wraps, "panic", "idemcore.Error" for a recorded error of fn's, or
// "_OTHER" (the semantic conventions' fallback). Never err's text.
func errorType(err error, panicked bool) string {
	if panicked {
		return "panic"
	}
	var pe *idemcore.PanicError
	if errors.As(err, &pe) {
		return "panic"
	}
	for _, s := range sentinels {
		if errors.Is(err, s.err) {
			return s.name
		}
	}
	var stored *idemcore.Error
	if errors.As(err, &stored) {
		return "idemcore.Error"
	}
	return "_OTHER"
}
