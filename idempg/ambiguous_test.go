package idempg_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idempg/internal/pgtest"
)

// TestAmbiguousCommitReadBack cuts the connection of the done record's
// UPDATE through a TCP proxy, and the engine reads the record back by its
// fencing token instead of writing again:
//
//   - cut after the statement (and so its COMMIT) reached the server and
//     ran, before its answer came back: the record is done with this
//     claim's token, so the call answers as if nothing happened;
//   - cut while pgx prepared the statement, before it ran: the record is
//     still started with this claim's token, so the done record is written
//     again on a fresh connection (fenced by the same token) and the call
//     answers; fn ran once.
func TestAmbiguousCommitReadBack(t *testing.T) {
	for _, tc := range []struct {
		name   string
		marker string // what the cut connection sends last
	}{
		// The response is a parameter of the UPDATE's Bind: it reaches the
		// server only with the execution.
		{"cut after the commit", "charged-7f3a"},
		// The statement's text is in its Parse, before any execution.
		{"cut before the execution", "state = 2, owner = NULL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := newStore(t, pgtest.Env)
			e, proxy := proxiedEngine(t, st)

			var runs atomic.Int32
			proxy.CutAfter(tc.marker)
			res, err := e.Do(context.Background(), "k", nil, func(context.Context) ([]byte, error) {
				runs.Add(1)
				return []byte("charged-7f3a"), nil
			})
			if proxy.Cut() != 1 {
				t.Fatalf("the proxy cut %d connections, want 1", proxy.Cut())
			}
			if runs.Load() != 1 {
				t.Fatalf("fn ran %d times", runs.Load())
			}
			rec, gerr := st.open(t, nil).Get("k")
			if gerr != nil {
				t.Fatal(gerr)
			}
			if err != nil || string(res.Response) != "charged-7f3a" {
				t.Fatalf("Do after a cut done write: %+v, %v; want its answer", res, err)
			}
			if rec.State != idemcore.StateDone || string(rec.Response) != "charged-7f3a" || rec.Attempt != 1 {
				t.Fatalf("record: %+v, want done, attempt 1", rec)
			}
		})
	}
}
