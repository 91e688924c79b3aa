package mcpproxy

import (
	"context"
	"testing"
	"time"
)

// TestDiedClearsTheChildBeforeItsContextEnds: a server's death is visible
// in the session (its child nil, or the next one) before the dead child's
// context ends, so that a protected call that sees the context end and runs
// again (runProtected's next round) never gets the dead child back from
// liveChild. Before, died cancelled the context first: under load the
// rounds could all run on the dead child before the session forgot it, and
// the call failed "died during the call 3 times" while the restarted
// server was on its way (seen once in CI, TestTaubenchJSONSaysWhereItRan).
func TestDiedClearsTheChildBeforeItsContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	c := &child{gen: 1, ctx: ctx, cancel: cancel, exited: make(chan struct{})}
	ready := make(chan struct{})
	close(ready)
	s := &session{child: c, ready: ready, pending: map[string]pending{}, closing: true, done: make(chan struct{})}
	s.mu.Lock() // died waits for the session's lock
	returned := make(chan struct{})
	go func() {
		s.died(c)
		close(returned)
	}()
	select {
	case <-c.ctx.Done():
		t.Error("the dead child's context ended while the session still had it as its live server")
	case <-time.After(200 * time.Millisecond):
	}
	s.mu.Unlock()
	<-returned
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.child == c {
		t.Error("after died, the session still has the dead child as its live server")
	}
}
