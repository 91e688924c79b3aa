package idemcore_test

import (
	"testing"
	"time"

	"github.com/idemkit/idem/idemcore"
)

func TestExpiry(t *testing.T) {
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	done := func(recorded time.Duration) *idemcore.Record {
		return &idemcore.Record{State: idemcore.StateDone, StartedAt: at.Add(-time.Minute), CompletedAt: at, Retention: recorded}
	}
	for _, c := range []struct {
		name      string
		r         *idemcore.Record
		retention time.Duration
		want      time.Time
	}{
		{"its own window, from completion", done(time.Hour), 0, at.Add(time.Hour)},
		{"a longer reader's window lengthens it", done(time.Hour), 2 * time.Hour, at.Add(2 * time.Hour)},
		{"a shorter reader's window does not shorten it", done(2 * time.Hour), time.Hour, at.Add(2 * time.Hour)},
		{"a started record, from its start", &idemcore.Record{State: idemcore.StateStarted, StartedAt: at, Retention: time.Hour}, 0, at.Add(time.Hour)},
		{"kept until resolved never expires", &idemcore.Record{State: idemcore.StateStarted, StartedAt: at, Retention: time.Hour, KeptUntilResolved: true}, time.Hour, time.Time{}},
	} {
		if got := idemcore.Expiry(c.r, c.retention); !got.Equal(c.want) {
			t.Errorf("%s: Expiry = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestDeadLetterExpiry(t *testing.T) {
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name                string
		recorded, retention time.Duration
		want                time.Time
	}{
		{"its own retention", time.Hour, 0, at.Add(time.Hour)},
		{"a longer reader's retention lengthens it", time.Hour, 2 * time.Hour, at.Add(2 * time.Hour)},
		{"a shorter reader's does not shorten it", 2 * time.Hour, time.Hour, at.Add(2 * time.Hour)},
		{"unrecorded (format 1): the default", 0, time.Hour, at.Add(idemcore.DefaultOutboxDeadLetterRetention)},
	} {
		m := &idemcore.Message{Dead: true, DeadAt: at, DeadLetterRetention: c.recorded}
		if got := idemcore.DeadLetterExpiry(m, c.retention); !got.Equal(c.want) {
			t.Errorf("%s: DeadLetterExpiry = %v, want %v", c.name, got, c.want)
		}
	}
}
