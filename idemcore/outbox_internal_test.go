package idemcore

import (
	"testing"
	"time"
)

// TestBackoff: the wait doubles from BaseBackoff per failed attempt up to
// MaxBackoff, without overflow for any attempt count, jittered into [w/2, w).
func TestBackoff(t *testing.T) {
	o := OutboxOptions{BaseBackoff: time.Second, MaxBackoff: time.Minute}
	for _, tc := range []struct {
		n    int
		want time.Duration // the unjittered wait
	}{
		{1, time.Second}, {2, 2 * time.Second}, {3, 4 * time.Second}, {6, 32 * time.Second},
		{7, time.Minute}, {40, time.Minute}, {63, time.Minute}, {64, time.Minute}, {1000, time.Minute},
	} {
		if lo := backoff(o, tc.n, 0); lo != tc.want/2 {
			t.Errorf("backoff(%d, 0) = %v, want %v", tc.n, lo, tc.want/2)
		}
		if hi := backoff(o, tc.n, 0.999999); hi < tc.want*99/100 || hi >= tc.want {
			t.Errorf("backoff(%d, ~1) = %v, want just under %v", tc.n, hi, tc.want)
		}
	}
}
