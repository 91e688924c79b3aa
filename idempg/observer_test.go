package idempg_test

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idemcore"
	"github.com/idemkit/idem/idempg/internal/pgtest"
)

// commitRecorder keeps the EventCommit events an engine reports.
type commitRecorder struct {
	mu      sync.Mutex
	commits []idemcore.Event
}

func (r *commitRecorder) Observe(ev idemcore.Event) {
	if ev.Kind == idemcore.EventCommit {
		r.mu.Lock()
		r.commits = append(r.commits, ev)
		r.mu.Unlock()
	}
}

func (r *commitRecorder) take() []idemcore.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.commits
	r.commits = nil
	return out
}

// The Postgres engine reports its commits as the bbolt engine does (so
// idemprom's and idemotel's commit durations have figures on either
// backend): a Do's claim and completion, one each; a DoTx, one (claim, fn's
// writes and the done record in one transaction); a replay, none.
func TestObserverSeesCommits(t *testing.T) {
	st := newStore(t, pgtest.Env)
	rec := &commitRecorder{}
	e := st.open(t, &idemcore.Options{Observer: rec})
	ctx := context.Background()
	ok := func(context.Context) ([]byte, error) { return []byte("ok"), nil }

	if _, err := e.Do(ctx, "k1", nil, ok); err != nil {
		t.Fatal(err)
	}
	got := rec.take()
	if len(got) != 2 {
		t.Fatalf("a first Do: %d commits %+v, want 2 (claim, completion)", len(got), got)
	}
	for _, c := range got {
		if c.N != 1 || c.Duration <= 0 {
			t.Fatalf("commit %+v: want N 1 and a duration", c)
		}
	}
	if _, err := e.Do(ctx, "k1", nil, ok); err != nil {
		t.Fatal(err)
	}
	if got := rec.take(); len(got) != 0 {
		t.Fatalf("a replay committed: %+v", got)
	}
	if _, err := e.DoTx(ctx, "t1", nil, func(context.Context, pgx.Tx) ([]byte, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	if got := rec.take(); len(got) != 1 || got[0].N != 1 {
		t.Fatalf("a DoTx: commits %+v, want one of one record", got)
	}
}
