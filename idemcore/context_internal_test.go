package idemcore

import (
	"context"
	"testing"
	"time"
)

// infoBackend answers only what New and fnContext ask of a backend: its
// Info, and Committed. Any other call panics (nil embedded interface).
type infoBackend struct {
	Backend[struct{}]
	info Info
}

func (b infoBackend) Info() Info               { return b.info }
func (infoBackend) Committed() <-chan struct{} { return nil }

// BenchmarkFnContext: the cost of fn's context, made, looked at once and
// stopped, as every execution does, and of one look (Err) at it: without a
// lease (bbolt) and with one (Postgres; the heartbeat's first renewal is an
// hour away, so none runs).
func BenchmarkFnContext(b *testing.B) {
	for _, tc := range []struct {
		name      string
		heartbeat time.Duration
	}{{"lease=none", 0}, {"lease=renewed", time.Hour}} {
		e, err := New[struct{}](infoBackend{info: Info{Heartbeat: tc.heartbeat}}, Options{PruneInterval: -1})
		if err != nil {
			b.Fatal(err)
		}
		c := &leading{key: "k", attempt: 1,
			claim: &Claim{Key: "k", Token: 1, LeaseUntil: time.Now().Add(2 * time.Hour)}}
		ctx := context.Background()
		b.Run(tc.name+"/op=make-look-stop", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				fctx, stop := e.fnContext(ctx, c, false)
				_ = fctx.Err()
				stop()
			}
		})
		b.Run(tc.name+"/op=look", func(b *testing.B) {
			fctx, stop := e.fnContext(ctx, c, false)
			defer stop()
			b.ReportAllocs()
			for b.Loop() {
				_ = fctx.Err()
			}
		})
		e.cancel()
	}
}
