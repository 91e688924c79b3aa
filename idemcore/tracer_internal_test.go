package idemcore

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

// lastEnd is a Tracer that keeps the last CallEnd.
type lastEnd struct{ end CallEnd }

func (l *lastEnd) StartCall(ctx context.Context, _ CallStart) context.Context         { return ctx }
func (l *lastEnd) EndCall(_ context.Context, e CallEnd)                               { l.end = e }
func (l *lastEnd) StartFn(ctx context.Context, _ FnStart) context.Context             { return ctx }
func (l *lastEnd) EndFn(context.Context, FnEnd)                                       {}
func (l *lastEnd) StartDelivery(ctx context.Context, _ DeliveryStart) context.Context { return ctx }
func (l *lastEnd) EndDelivery(context.Context, DeliveryEnd)                           {}
func (l *lastEnd) MessageTrace(context.Context) []byte                                { return nil }

// endCall tells the engine's failures from fn's outcomes and refusals.
func TestEndCallClassifies(t *testing.T) {
	stored := &Error{Code: "declined", Message: "card declined"}
	for _, tc := range []struct {
		name     string
		set      CallOutcome
		panicked bool
		err      error
		want     CallOutcome
		failed   bool
	}{
		{"success", OutcomeExecuted, false, nil, OutcomeExecuted, false},
		{"fn's recorded error", OutcomeExecuted, false, stored, OutcomeExecuted, false},
		{"fn's retryable error", OutcomeRecovered, false, Retryable(errors.New("later")), OutcomeRecovered, false},
		{"a failed commit after fn", OutcomeExecuted, false, &OpError{Op: "do", Key: "k", Err: ErrStorageFailed}, OutcomeExecuted, true},
		{"fn's context ended", OutcomeExecuted, false, context.Canceled, OutcomeExecuted, true},
		{"a replayed error", OutcomeReplayed, false, stored, OutcomeReplayed, false},
		{"a waiter's copy of fn's error", OutcomeWaited, false, stored, OutcomeWaited, false},
		{"a mismatch", 0, false, &OpError{Op: "do", Key: "k", Err: fmt.Errorf("%w: other", ErrFingerprintMismatch)}, OutcomeRefused, false},
		{"in progress", 0, false, &OpError{Op: "do", Key: "k", Err: &InProgressError{}}, OutcomeRefused, false},
		{"a failed read", 0, false, &OpError{Op: "do", Key: "k", Err: errors.New("connection reset")}, OutcomeFailed, true},
		{"a wait cancelled", 0, false, context.Canceled, OutcomeFailed, true},
		{"fn panicked", OutcomeExecuted, true, nil, OutcomeExecuted, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := &lastEnd{}
			ct := callTrace{t: l, outcome: tc.set, panicked: tc.panicked}
			ct.endCall(context.Background(), "do", tc.err)
			if l.end.Outcome != tc.want || l.end.EngineFailed != tc.failed || l.end.Panicked != tc.panicked {
				t.Fatalf("got %v, engine failed %v, panicked %v; want %v, %v, %v", l.end.Outcome, l.end.EngineFailed, l.end.Panicked, tc.want, tc.failed, tc.panicked)
			}
		})
	}
}

func TestOutcomeNames(t *testing.T) {
	for v, want := range map[fmt.Stringer]string{
		OutcomeExecuted: "executed", OutcomeFailed: "failed", CallOutcome(0): "CallOutcome(0)", CallOutcome(99): "CallOutcome(99)",
		DeliveryDeadLetter: "dead_letter", DeliveryOutcome(9): "DeliveryOutcome(9)",
		EventInProgress: "in_progress", EventKind(200): "EventKind(200)",
	} {
		if got := v.String(); got != want {
			t.Errorf("%#v.String() = %q, want %q", v, got, want)
		}
	}
}
