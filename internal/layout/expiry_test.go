package layout

import (
	"testing"
	"time"
)

func TestExpiry(t *testing.T) {
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name                string
		kept                bool
		recorded, retention time.Duration
		want                time.Time
	}{
		{"its own window", false, time.Hour, 0, at.Add(time.Hour)},
		{"a longer reader's window lengthens it", false, time.Hour, 2 * time.Hour, at.Add(2 * time.Hour)},
		{"a shorter reader's window does not shorten it", false, 2 * time.Hour, time.Hour, at.Add(2 * time.Hour)},
		{"kept until resolved never expires", true, time.Hour, time.Hour, time.Time{}},
	} {
		if got := Expiry(c.kept, at, c.recorded, c.retention); !got.Equal(c.want) {
			t.Errorf("%s: Expiry = %v, want %v", c.name, got, c.want)
		}
	}
}
