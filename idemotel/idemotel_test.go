package idemotel_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idemotel"
)

// The key, fingerprint, response and error text of the tests: none may
// appear in any span or metric.
const (
	secretKey  = "user-4242@example.com/charge"
	secretFP   = "card=4111111111111111"
	secretResp = "receipt-for-jane-doe"
	secretErr  = "jane doe's card was declined"
)

// each runs test on each backend.
func each(t *testing.T, test func(t *testing.T, b backend)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) { test(t, b) })
	}
}

// waitSignal is an Observer that closes waiting at the first EventWait.
type waitSignal struct{ waiting chan struct{} }

func (w *waitSignal) Observe(ev idemcore.Event) {
	if ev.Kind == idemcore.EventWait {
		select {
		case <-w.waiting:
		default:
			close(w.waiting)
		}
	}
}

// wantAttr checks one attribute of s.
func wantAttr(t *testing.T, s sdktrace.ReadOnlySpan, k attribute.Key, want any) {
	t.Helper()
	v, ok := attrs(s)[k]
	if !ok {
		t.Errorf("span %s: no %s (attributes %v)", s.Name(), k, s.Attributes())
		return
	}
	if got := v.AsInterface(); got != want {
		t.Errorf("span %s: %s = %v (%T), want %v (%T)", s.Name(), k, got, got, want, want)
	}
}

// noAttr checks that s lacks k.
func noAttr(t *testing.T, s sdktrace.ReadOnlySpan, k attribute.Key) {
	t.Helper()
	if v, ok := attrs(s)[k]; ok {
		t.Errorf("span %s: %s = %v, want none", s.Name(), k, v.Emit())
	}
}

func TestExecutedAndReplayed(t *testing.T) {
	each(t, func(t *testing.T, b backend) {
		o := &idemcore.Options{}
		tel, eng := b.start(t, o)
		ctx, end := tel.parentCtx(context.Background())
		fn := func(ctx context.Context) ([]byte, error) {
			// fn's own work: a child of idem.fn.
			_, s := tel.tp.Tracer("test").Start(ctx, "charge card")
			s.End()
			return []byte(secretResp), nil
		}
		if _, err := eng.do(ctx, secretKey, []byte(secretFP), fn); err != nil {
			t.Fatal(err)
		}
		res, err := eng.do(ctx, secretKey, []byte(secretFP), fn)
		if err != nil || !res.Replayed {
			t.Fatalf("second call: %+v, %v; want a replay", res, err)
		}
		end()
		parent := tel.one(t, "request")
		calls := tel.ended("idem.do")
		if len(calls) != 2 {
			t.Fatalf("%d idem.do spans, want 2", len(calls))
		}
		first, replay := calls[0], calls[1]
		for _, s := range calls {
			if s.Parent().SpanID() != parent.SpanContext().SpanID() || s.SpanContext().TraceID() != parent.SpanContext().TraceID() {
				t.Errorf("%s's parent is %v, want the request span %v", s.Name(), s.Parent().SpanID(), parent.SpanContext().SpanID())
			}
			wantAttr(t, s, idemotel.AttrBackend, b.name)
			wantAttr(t, s, idemotel.AttrOperation, "do")
			wantAttr(t, s, idemotel.AttrAttempt, int64(1))
			if s.Status().Code != codes.Unset {
				t.Errorf("%s: status %v, want unset", s.Name(), s.Status())
			}
			noAttr(t, s, "error.type")
		}
		wantAttr(t, first, idemotel.AttrOutcome, "executed")
		wantAttr(t, replay, idemotel.AttrOutcome, "replayed")
		fnSpan := tel.one(t, "idem.fn") // the replay runs no fn
		if fnSpan.Parent().SpanID() != first.SpanContext().SpanID() {
			t.Errorf("idem.fn's parent is %v, want the first idem.do %v", fnSpan.Parent().SpanID(), first.SpanContext().SpanID())
		}
		wantAttr(t, fnSpan, idemotel.AttrAttempt, int64(1))
		work := tel.one(t, "charge card")
		if work.Parent().SpanID() != fnSpan.SpanContext().SpanID() {
			t.Errorf("fn's own span's parent is %v, want idem.fn %v", work.Parent().SpanID(), fnSpan.SpanContext().SpanID())
		}

		rm := tel.collect(t)
		calls2 := outcomes(t, rm)
		if calls2["executed"] != 1 || calls2["replayed"] != 1 {
			t.Errorf("idem.calls by outcome: %v, want executed 1 and replayed 1", calls2)
		}
		if n := histCount(t, rm, "idem.fn.duration"); n != 1 {
			t.Errorf("idem.fn.duration has %d points, want 1", n)
		}
		if n := histCount(t, rm, "idem.call.duration"); n != 2 {
			t.Errorf("idem.call.duration has %d points, want 2", n)
		}
		if active := sumInt(t, rm, "idem.call.active"); active != 0 {
			t.Errorf("idem.call.active = %d once every call returned, want 0", active)
		}
		if b.name == "bbolt" {
			if n := histCount(t, rm, "idem.commit.duration"); n == 0 {
				t.Error("idem.commit.duration has no points after bbolt commits")
			}
		}
		assertNoSecret(t, tel, secretKey, secretFP, secretResp)
	})
}

// A recorded error of fn's is an answer: the call's span has no error
// status, first or replayed; fn's own span has one, with no text.
func TestStoredErrorIsNotAFailure(t *testing.T) {
	each(t, func(t *testing.T, b backend) {
		o := &idemcore.Options{}
		tel, eng := b.start(t, o)
		fn := func(context.Context) ([]byte, error) {
			return nil, idemcore.WithCode(errors.New(secretErr), "card_declined")
		}
		for range 2 {
			var stored *idemcore.Error
			if _, err := eng.do(context.Background(), secretKey, []byte(secretFP), fn); !errors.As(err, &stored) {
				t.Fatalf("err %v, want a recorded *Error", err)
			}
		}
		calls := tel.ended("idem.do")
		if len(calls) != 2 {
			t.Fatalf("%d idem.do spans, want 2", len(calls))
		}
		for i, want := range []string{"executed", "replayed"} {
			s := calls[i]
			wantAttr(t, s, idemotel.AttrOutcome, want)
			wantAttr(t, s, idemotel.AttrStoredError, true)
			noAttr(t, s, "error.type")
			if s.Status().Code != codes.Unset {
				t.Errorf("%s call: status %v, want unset (a recorded answer)", want, s.Status())
			}
			if len(s.Events()) != 0 {
				t.Errorf("%s call: events %v, want none", want, s.Events())
			}
		}
		fnSpan := tel.one(t, "idem.fn")
		if fnSpan.Status().Code != codes.Error {
			t.Errorf("idem.fn status %v, want Error", fnSpan.Status())
		}
		assertNoSecret(t, tel, secretKey, secretFP, secretErr)
	})
}

func TestRefused(t *testing.T) {
	each(t, func(t *testing.T, b backend) {
		o := &idemcore.Options{}
		tel, eng := b.start(t, o)
		ok := func(context.Context) ([]byte, error) { return []byte(secretResp), nil }
		if _, err := eng.do(context.Background(), secretKey, []byte(secretFP), ok); err != nil {
			t.Fatal(err)
		}
		if _, err := eng.do(context.Background(), secretKey, []byte("other"), ok); !errors.Is(err, idemcore.ErrFingerprintMismatch) {
			t.Fatalf("err %v, want ErrFingerprintMismatch", err)
		}
		bad := " " + secretKey // leading white space
		if _, err := eng.do(context.Background(), bad, nil, ok); !errors.Is(err, idemcore.ErrInvalidKey) {
			t.Fatalf("err %v, want ErrInvalidKey", err)
		}
		calls := tel.ended("idem.do")
		if len(calls) != 3 {
			t.Fatalf("%d idem.do spans, want 3", len(calls))
		}
		for i, want := range []string{"ErrFingerprintMismatch", "ErrInvalidKey"} {
			s := calls[i+1]
			wantAttr(t, s, idemotel.AttrOutcome, "refused")
			wantAttr(t, s, "error.type", want)
			if s.Status().Code != codes.Unset {
				t.Errorf("refused call: status %v, want unset (the engine did its work)", s.Status())
			}
		}
		rm := tel.collect(t)
		if got := outcomes(t, rm); got["refused"] != 2 {
			t.Errorf("idem.calls by outcome: %v, want refused 2", got)
		}
		assertNoSecret(t, tel, secretKey, secretFP, secretResp)
	})
}

func TestWaitedAndInProgress(t *testing.T) {
	each(t, func(t *testing.T, b backend) {
		for _, policy := range []idemcore.InFlightPolicy{idemcore.InFlightWait, idemcore.InFlightFail} {
			w := &waitSignal{waiting: make(chan struct{})}
			o := &idemcore.Options{InFlight: policy, Observer: w}
			tel, eng := b.start(t, o)
			started, release := make(chan struct{}), make(chan struct{})
			led := make(chan error, 1)
			go func() {
				_, err := eng.do(context.Background(), secretKey, []byte(secretFP), func(context.Context) ([]byte, error) {
					close(started)
					<-release
					return []byte(secretResp), nil
				})
				led <- err
			}()
			<-started
			dup := make(chan error, 1)
			go func() {
				res, err := eng.do(context.Background(), secretKey, []byte(secretFP), func(context.Context) ([]byte, error) {
					return nil, errors.New("the duplicate's fn ran")
				})
				if err == nil && !res.Replayed {
					err = errors.New("the duplicate's answer is not a replay")
				}
				dup <- err
			}()
			if policy == idemcore.InFlightWait {
				<-w.waiting
				close(release)
				if err := <-dup; err != nil {
					t.Fatal(err)
				}
			} else {
				if err := <-dup; !errors.Is(err, idemcore.ErrInProgress) {
					t.Fatalf("duplicate under InFlightFail: %v, want ErrInProgress", err)
				}
				close(release)
			}
			if err := <-led; err != nil {
				t.Fatal(err)
			}
			var outcome []string
			var dupSpan sdktrace.ReadOnlySpan
			for _, s := range tel.ended("idem.do") {
				o := attrs(s)[idemotel.AttrOutcome].AsString()
				outcome = append(outcome, o)
				if o != "executed" {
					dupSpan = s
				}
			}
			if dupSpan == nil {
				t.Fatalf("outcomes %v: no duplicate's span", outcome)
			}
			if policy == idemcore.InFlightWait {
				wantAttr(t, dupSpan, idemotel.AttrOutcome, "waited")
				wantAttr(t, dupSpan, idemotel.AttrAttempt, int64(1))
				if v, ok := attrs(dupSpan)[idemotel.AttrWaitSeconds]; !ok || v.AsFloat64() <= 0 {
					t.Errorf("waited call: idem.wait.duration %v, want > 0", v.Emit())
				}
				if n := histCount(t, tel.collect(t), "idem.wait.duration"); n != 1 {
					t.Errorf("idem.wait.duration has %d points, want 1", n)
				}
			} else {
				wantAttr(t, dupSpan, idemotel.AttrOutcome, "refused")
				wantAttr(t, dupSpan, "error.type", "ErrInProgress")
			}
			if dupSpan.Status().Code != codes.Unset {
				t.Errorf("duplicate: status %v, want unset", dupSpan.Status())
			}
			assertNoSecret(t, tel, secretKey, secretFP, secretResp)
		}
	})
}

// A call whose fn returns after its own context ended leaves an interrupted
// execution; the next call recovers it (attempt 2).
func TestRecovered(t *testing.T) {
	each(t, func(t *testing.T, b backend) {
		o := &idemcore.Options{}
		tel, eng := b.start(t, o)
		ctx, cancel := context.WithCancel(context.Background())
		_, err := eng.do(ctx, secretKey, []byte(secretFP), func(ctx context.Context) ([]byte, error) {
			cancel()
			return nil, ctx.Err()
		})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("interrupted call: %v, want context.Canceled", err)
		}
		res, err := eng.do(context.Background(), secretKey, []byte(secretFP), func(ctx context.Context) ([]byte, error) {
			return []byte(secretResp), nil
		})
		if err != nil || res.Attempt != 2 {
			t.Fatalf("recovering call: %+v, %v; want attempt 2", res, err)
		}
		calls := tel.ended("idem.do")
		if len(calls) != 2 {
			t.Fatalf("%d idem.do spans, want 2", len(calls))
		}
		cut, rec := calls[0], calls[1]
		wantAttr(t, cut, idemotel.AttrOutcome, "executed")
		wantAttr(t, cut, "error.type", "context.Canceled")
		if cut.Status().Code != codes.Error {
			t.Errorf("interrupted call: status %v, want Error (no outcome recorded)", cut.Status())
		}
		wantAttr(t, rec, idemotel.AttrOutcome, "recovered")
		wantAttr(t, rec, idemotel.AttrAttempt, int64(2))
		if rec.Status().Code != codes.Unset {
			t.Errorf("recovering call: status %v, want unset", rec.Status())
		}
		fns := tel.ended("idem.fn")
		if len(fns) != 2 {
			t.Fatalf("%d idem.fn spans, want 2", len(fns))
		}
		wantAttr(t, fns[1], idemotel.AttrRecovered, true)
		wantAttr(t, fns[1], idemotel.AttrAttempt, int64(2))
		assertNoSecret(t, tel, secretKey, secretFP, secretResp)
	})
}

// A panic of fn ends both spans, with an Error status of class "panic".
func TestPanic(t *testing.T) {
	each(t, func(t *testing.T, b backend) {
		o := &idemcore.Options{}
		tel, eng := b.start(t, o)
		func() {
			defer func() {
				if v := recover(); v != secretErr {
					t.Errorf("recovered %v, want fn's panic value", v)
				}
			}()
			_, _ = eng.do(context.Background(), secretKey, []byte(secretFP), func(context.Context) ([]byte, error) {
				panic(secretErr)
			})
		}()
		for _, name := range []string{"idem.do", "idem.fn"} {
			s := tel.one(t, name)
			wantAttr(t, s, "error.type", "panic")
			if s.Status().Code != codes.Error {
				t.Errorf("%s: status %v, want Error", name, s.Status())
			}
		}
		if active := sumInt(t, tel.collect(t), "idem.call.active"); active != 0 {
			t.Errorf("idem.call.active = %d after the panic, want 0", active)
		}
		assertNoSecret(t, tel, secretKey, secretFP, secretErr)
	})
}

// Options.KeyHashSecret adds an HMAC of the key, never the key.
func TestKeyHash(t *testing.T) {
	o := &idemcore.Options{}
	secret := []byte("telemetry secret")
	tel := newTelemetry(t, o, &idemotel.Options{KeyHashSecret: secret})
	eng := openBolt(t, o)
	if _, err := eng.do(context.Background(), secretKey, nil, func(context.Context) ([]byte, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(secretKey))
	wantAttr(t, tel.one(t, "idem.do"), idemotel.AttrKeyHash, hex.EncodeToString(h.Sum(nil)[:16]))
	assertNoSecret(t, tel, secretKey)

	// Without the option, no such attribute.
	o2 := &idemcore.Options{}
	tel2 := newTelemetry(t, o2, nil)
	eng2 := openBolt(t, o2)
	if _, err := eng2.do(context.Background(), secretKey, nil, func(context.Context) ([]byte, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	noAttr(t, tel2.one(t, "idem.do"), idemotel.AttrKeyHash)
}

// Install keeps an Observer already set: both get the events.
func TestInstallKeepsObserver(t *testing.T) {
	w := &waitSignal{waiting: make(chan struct{})}
	o := &idemcore.Options{Observer: w}
	newTelemetry(t, o, nil)
	o.Observer.Observe(idemcore.Event{Kind: idemcore.EventWait})
	select {
	case <-w.waiting:
	default:
		t.Fatal("the Observer set before Install got no event")
	}
	if o.Tracer == nil {
		t.Fatal("Install set no Tracer")
	}
}

// outcomes sums idem.calls by idem.outcome.
func outcomes(t *testing.T, rm metricdata.ResourceMetrics) map[string]int64 {
	t.Helper()
	return sumBy(t, rm, "idem.calls", idemotel.AttrOutcome)
}

// histCount sums the counts of histogram name's points (0 if absent).
func histCount(t *testing.T, rm metricdata.ResourceMetrics, name string) uint64 {
	t.Helper()
	m, ok := findMetric(rm, name)
	if !ok {
		return 0
	}
	var n uint64
	for _, p := range m.Data.(metricdata.Histogram[float64]).DataPoints {
		n += p.Count
	}
	return n
}

// sumInt sums the points of int64 sum name.
func sumInt(t *testing.T, rm metricdata.ResourceMetrics, name string) int64 {
	t.Helper()
	m, ok := findMetric(rm, name)
	if !ok {
		t.Fatalf("no %s", name)
	}
	var n int64
	for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
		n += p.Value
	}
	return n
}
