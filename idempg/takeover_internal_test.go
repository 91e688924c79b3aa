package idempg

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/idemcore"
)

// TestTakeoverKeepsTheLongerWindow: a claim that takes an interrupted
// execution over stores the longer of the two windows and the mark kept
// until resolved if either has it (idemcore.ClaimRequest), so that the
// evidence of the first unknown outcome lasts as long as it would have,
// also when the recovering attempt's process dies before it can put the
// record back; its start is the database's stamp.
func TestTakeoverKeepsTheLongerWindow(t *testing.T) {
	var offset atomic.Int64
	b := backends(t, 1, &offset)[0]
	ctx := context.Background()
	week := 7 * 24 * time.Hour
	for _, kept := range []bool{false, true} {
		key := "k"
		if kept {
			key = "kept"
		}
		at := time.Now().Add(-time.Minute).Round(time.Microsecond)
		prev := &idemcore.Record{Key: key, State: idemcore.StateStarted, Fingerprint: 1, Attempt: 1, StartedAt: at, Retention: week, KeptUntilResolved: kept}
		if err := b.Resolve(ctx, key, func(*idemcore.Record) (*idemcore.Record, error) { return prev, nil }); err != nil {
			t.Fatal(err)
		}
		stored, _, err := b.Lookup(ctx, idemcore.Lookup{Key: key})
		if err != nil || stored == nil {
			t.Fatalf("lookup: %+v, %v", stored, err)
		}
		st := &idemcore.Record{Key: key, State: idemcore.StateStarted, Fingerprint: 1, Attempt: 2, StartedAt: time.Unix(1, 0), Retention: time.Hour}
		res, err := b.Claim(ctx, idemcore.ClaimRequest{Started: st, Prev: stored})
		if err != nil || res.Status != idemcore.Claimed {
			t.Fatalf("takeover: %+v, %v", res, err)
		}
		r, now, err := b.Lookup(ctx, idemcore.Lookup{Key: key})
		if err != nil || r == nil {
			t.Fatalf("lookup after the takeover: %+v, %v", r, err)
		}
		if r.Retention != week || r.KeptUntilResolved != kept {
			t.Errorf("%s: the takeover stored window %v, kept %v; want %v, %v (the interrupted execution's)", key, r.Retention, r.KeptUntilResolved, week, kept)
		}
		if !r.StartedAt.Equal(st.StartedAt) || now.Sub(r.StartedAt).Abs() > time.Minute {
			t.Errorf("%s: started %v (the claim says %v), the database's clock %v: want the database's stamp", key, r.StartedAt, st.StartedAt, now)
		}
	}
}
