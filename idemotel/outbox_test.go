package idemotel_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idemotel"
)

const secretPayload = "deliver to jane doe, 1 main street"

// attemptsEnded is an Observer that signals each delivery attempt whose
// outcome is recorded.
type attemptsEnded struct{ c chan struct{} }

func (a *attemptsEnded) Observe(ev idemcore.Event) {
	if ev.Kind == idemcore.EventDelivery || ev.Kind == idemcore.EventDeliveryFailed {
		a.c <- struct{}{}
	}
}

// Each delivery attempt is a span idem.deliver of its own, linked to the
// idem.dotx span of the call that enqueued the message (the trace context
// stored with it), with its attempt and outcome; a dead letter says so.
func TestDeliverySpansLinkToTheCall(t *testing.T) {
	each(t, func(t *testing.T, b backend) {
		ended := &attemptsEnded{c: make(chan struct{}, 2)}
		o := &idemcore.Options{Observer: ended, Outbox: idemcore.OutboxOptions{Dispatch: true, MaxAttempts: 1, Handlers: map[string]idemcore.Handler{
			"mail": func(context.Context, idemcore.Message) error { return nil },
			"fail": func(context.Context, idemcore.Message) error { return errors.New(secretErr) },
		}}}
		tel, eng := b.start(t, o)
		ctx, end := tel.parentCtx(context.Background())
		if _, err := eng.dotx(ctx, secretKey, []byte(secretFP), "mail", []byte(secretPayload)); err != nil {
			t.Fatal(err)
		}
		if _, err := eng.dotx(ctx, secretKey+"-2", []byte(secretFP), "fail", []byte(secretPayload)); err != nil {
			t.Fatal(err)
		}
		end()
		<-ended.c // both attempts' outcomes are recorded
		<-ended.c
		if err := eng.close(); err != nil { // waits for the dispatcher: every attempt has ended
			t.Fatal(err)
		}
		calls := tel.ended("idem.dotx")
		if len(calls) != 2 {
			t.Fatalf("%d idem.dotx spans, want 2", len(calls))
		}
		for _, c := range calls {
			wantAttr(t, c, idemotel.AttrOutcome, "executed")
		}
		for _, fn := range tel.ended("idem.fn") { // bbolt may run a DoTx fn more than once
			if p := fn.Parent().SpanID(); p != calls[0].SpanContext().SpanID() && p != calls[1].SpanContext().SpanID() {
				t.Errorf("idem.fn's parent %v is no idem.dotx span", p)
			}
			wantAttr(t, fn, idemotel.AttrOperation, "dotx")
		}
		if n := len(tel.ended("idem.fn")); n < 2 {
			t.Errorf("%d idem.fn spans, want one per run of each DoTx fn (2 at least)", n)
		}
		byTopic := map[string]trace.SpanContext{"mail": calls[0].SpanContext(), "fail": calls[1].SpanContext()}
		deliveries := tel.ended("idem.deliver")
		if len(deliveries) != 2 {
			t.Fatalf("%d idem.deliver spans, want 2 (all: %v)", len(deliveries), names(tel.spans.Ended()))
		}
		for _, d := range deliveries {
			topic := attrs(d)["messaging.destination.name"].AsString()
			want, ok := byTopic[topic]
			if !ok {
				t.Fatalf("idem.deliver of topic %q", topic)
			}
			if d.SpanKind() != trace.SpanKindConsumer {
				t.Errorf("%s: kind %v, want consumer", topic, d.SpanKind())
			}
			if l := d.Links(); len(l) != 1 || l[0].SpanContext.SpanID() != want.SpanID() || l[0].SpanContext.TraceID() != want.TraceID() {
				t.Errorf("%s: links %v, want one to the enqueuing call's span %v", topic, l, want)
			}
			if d.Parent().IsValid() {
				t.Errorf("%s: parent %v, want none (the dispatcher's context has no span)", topic, d.Parent())
			}
			wantAttr(t, d, idemotel.AttrAttempt, int64(1))
			wantAttr(t, d, "messaging.message.delivery_attempt", int64(1))
			wantAttr(t, d, "messaging.system", "idem")
			if id := attrs(d)["messaging.message.id"].AsString(); id == "" || id == "0" {
				t.Errorf("%s: messaging.message.id %q, want the message's Seq", topic, id)
			}
			wantAttr(t, d, idemotel.AttrBackend, b.name)
			switch topic {
			case "mail":
				wantAttr(t, d, idemotel.AttrOutcome, "delivered")
				noAttr(t, d, idemotel.AttrDeadLetter)
				if d.Status().Code != codes.Unset {
					t.Errorf("delivered: status %v, want unset", d.Status())
				}
			case "fail":
				wantAttr(t, d, idemotel.AttrOutcome, "dead_letter")
				wantAttr(t, d, idemotel.AttrDeadLetter, true)
				wantAttr(t, d, "error.type", "_OTHER")
				if d.Status().Code != codes.Error {
					t.Errorf("failed: status %v, want Error", d.Status())
				}
			}
		}
		rm := tel.collect(t)
		got := sumBy(t, rm, "idem.outbox.deliveries", idemotel.AttrOutcome)
		if got["delivered"] != 1 || got["dead_letter"] != 1 {
			t.Errorf("idem.outbox.deliveries by outcome %v, want delivered 1, dead_letter 1", got)
		}
		if n := sumInt(t, rm, "idem.outbox.dead_lettered"); n != 1 {
			t.Errorf("idem.outbox.dead_lettered = %d, want 1", n)
		}
		assertNoSecret(t, tel, secretKey, secretFP, secretPayload, secretErr)
	})
}

// The backlog gauges read the engine's OutboxBacklog at each collection.
func TestBacklogGauges(t *testing.T) {
	each(t, func(t *testing.T, b backend) {
		o := &idemcore.Options{}
		tel, eng := b.start(t, o)
		if err := tel.ObserveBacklog(eng.backlog); err != nil {
			t.Fatal(err)
		}
		gauge := func(name string) int64 {
			t.Helper()
			m, ok := findMetric(tel.collect(t), name)
			if !ok {
				t.Fatalf("no %s", name)
			}
			pts := m.Data.(metricdata.Gauge[int64]).DataPoints
			if len(pts) != 1 {
				t.Fatalf("%s: %d points, want 1", name, len(pts))
			}
			return pts[0].Value
		}
		if n := gauge("idem.outbox.backlog"); n != 0 {
			t.Fatalf("backlog %d before any message, want 0", n)
		}
		for _, k := range []string{"a", "b"} {
			if _, err := eng.dotx(context.Background(), k, nil, "mail", nil); err != nil {
				t.Fatal(err)
			}
		}
		if n := gauge("idem.outbox.backlog"); n != 2 {
			t.Errorf("backlog %d after two messages, want 2", n)
		}
		if n := gauge("idem.outbox.dead_letters"); n != 0 {
			t.Errorf("dead letters %d, want 0", n)
		}
		if err := tel.Close(); err != nil {
			t.Fatal(err)
		}
		if _, ok := findMetric(tel.collect(t), "idem.outbox.backlog"); ok {
			t.Error("the backlog is still read after Close")
		}
	})
}

// Pruned records are counted (bbolt: its clock can be moved).
func TestPrunedCounter(t *testing.T) {
	now := time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
	o := &idemcore.Options{Now: func() time.Time { return now }, PruneInterval: -1, Retention: time.Hour}
	tel := newTelemetry(t, o, nil)
	path := t.TempDir()
	eng := openBoltAt(t, path, o)
	for _, k := range []string{"a", "b", "c"} {
		if _, err := eng.Do(context.Background(), k, nil, func(context.Context) ([]byte, error) { return nil, nil }); err != nil {
			t.Fatal(err)
		}
	}
	now = now.Add(3 * time.Hour)
	n, err := eng.Prune(context.Background())
	if err != nil || n != 3 {
		t.Fatalf("Prune: %d, %v; want 3", n, err)
	}
	if got := sumInt(t, tel.collect(t), "idem.pruned"); got != 3 {
		t.Errorf("idem.pruned = %d, want 3", got)
	}
}
