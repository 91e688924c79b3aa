package idemcore

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// A lease context judges its lease as last renewed on every Err, Done and
// Cause, not by its timer alone: a lease moved into the past (the timer set
// an hour ahead cannot have fired) ends it at the next look, with cause
// ErrLeaseLost, Done closed first, and its children (WithCancel, AfterFunc)
// ended with it; its Deadline and values stay the parent's.
func TestLeaseCtxJudgesItsLease(t *testing.T) {
	type key struct{}
	deadline := time.Now().Add(3 * time.Hour)
	parent, cancel := context.WithDeadline(context.WithValue(context.Background(), key{}, "v"), deadline)
	defer cancel()
	for _, look := range []string{"Err", "Done", "Cause"} {
		t.Run(look, func(t *testing.T) {
			c := newLeaseCtx(parent, time.Now().Add(time.Hour), nil)
			defer c.stop()
			child, stopChild := context.WithCancel(c)
			defer stopChild()
			ran := make(chan struct{})
			context.AfterFunc(c, func() { close(ran) })
			if c.Err() != nil || child.Err() != nil {
				t.Fatal("ended before its lease")
			}
			c.extend(time.Now().Add(-time.Nanosecond)) // a renewal's end, passed
			switch look {
			case "Err":
				if c.Err() == nil {
					t.Fatal("Err: live after its lease")
				}
			case "Done":
				select {
				case <-c.Done():
				default:
					t.Fatal("Done: open after its lease")
				}
			case "Cause":
				if context.Cause(c) == nil {
					t.Fatal("Cause: nil after its lease")
				}
			}
			if !errors.Is(c.Err(), context.Canceled) || !errors.Is(context.Cause(c), ErrLeaseLost) {
				t.Fatalf("Err %v, Cause %v; want Canceled, ErrLeaseLost", c.Err(), context.Cause(c))
			}
			if !errors.Is(context.Cause(child), ErrLeaseLost) {
				t.Fatalf("a child: cause %v, want ErrLeaseLost", context.Cause(child))
			}
			select {
			case <-ran:
			case <-time.After(30 * time.Second): // a hang guard, not a timing claim
				t.Fatal("an AfterFunc of the context never ran")
			}
			if d, ok := c.Deadline(); !ok || !d.Equal(deadline) || c.Value(key{}) != "v" {
				t.Fatalf("Deadline %v %v, Value %v; want the parent's", d, ok, c.Value(key{}))
			}
		})
	}
}

// A renewal moves the lease's end forward: the context stays live past the
// first end (here, a lease that began passed and was renewed before any
// look).
func TestLeaseCtxRenewed(t *testing.T) {
	c := newLeaseCtx(context.Background(), time.Now().Add(time.Hour), nil)
	defer c.stop()
	c.extend(time.Now().Add(2 * time.Hour))
	if c.Err() != nil || c.left() < time.Hour+30*time.Minute {
		t.Fatalf("renewed: Err %v, left %v; want live, about two hours", c.Err(), c.left())
	}
}

// The timer ends the context at its lease's end for those that only wait
// on Done: here a child, which never looks at the lease itself.
func TestLeaseCtxTimer(t *testing.T) {
	c := newLeaseCtx(context.Background(), time.Now().Add(time.Millisecond), nil)
	defer c.stop()
	child, cancel := context.WithCancel(c)
	defer cancel()
	select {
	case <-child.Done():
	case <-time.After(30 * time.Second): // a hang guard
		t.Fatal("the timer never ended the context")
	}
	if !errors.Is(context.Cause(child), ErrLeaseLost) {
		t.Fatalf("cause %v, want ErrLeaseLost", context.Cause(child))
	}
}

// A lease already past when its context is made (a claim whose answer
// came back late, on a loaded machine) ends at once and logs its lapse: the
// logger is the context's from the start, so the timer, which may fire
// before the constructor returns, never races a later assignment of it.
func TestLeaseCtxPastAtStartLogsLapse(t *testing.T) {
	logged := make(chan struct{}, 1)
	c := newLeaseCtx(context.Background(), time.Now().Add(-time.Second), func() { logged <- struct{}{} })
	defer c.stop()
	select {
	case <-logged:
	case <-time.After(30 * time.Second): // a hang guard
		t.Fatal("the lapse of a lease past at start was never logged")
	}
	if !errors.Is(context.Cause(c), ErrLeaseLost) {
		t.Fatalf("cause %v, want ErrLeaseLost", context.Cause(c))
	}
}

// Stopped first, it is not a lost lease, and a lapse after that changes
// nothing; a zero lease end never lapses.
func TestLeaseCtxStop(t *testing.T) {
	c := newLeaseCtx(context.Background(), time.Now().Add(time.Hour), nil)
	c.stop()
	c.extend(time.Now().Add(-time.Nanosecond))
	if !errors.Is(context.Cause(c), context.Canceled) || errors.Is(context.Cause(c), ErrLeaseLost) {
		t.Fatalf("stopped: cause %v, want Canceled", context.Cause(c))
	}
	n := newLeaseCtx(context.Background(), time.Time{}, nil)
	defer n.stop()
	if n.leased || n.Err() != nil {
		t.Fatal("a zero lease end lapses")
	}
}

// Goroutines that look at once when the lease has passed all find it
// ended, each with Done closed (run with -race).
func TestLeaseCtxConcurrentLooks(t *testing.T) {
	for range 50 {
		c := newLeaseCtx(context.Background(), time.Now().Add(time.Hour), nil)
		c.extend(time.Now().Add(-time.Nanosecond))
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				if c.Err() == nil {
					t.Error("a look after the lease found it live")
					return
				}
				select {
				case <-c.Context.Done():
				default:
					t.Error("Err not nil while Done is open")
				}
			})
		}
		wg.Wait()
		c.stop()
	}
}

// A timer that fires before a renewed end waits for that end: the context
// stays live past its first end (a check that can only fail if the timer
// ends a renewed lease; a stalled machine makes it weaker, never wrong).
func TestLeaseCtxTimerWaitsForRenewal(t *testing.T) {
	for {
		first := time.Now().Add(20 * time.Millisecond)
		c := newLeaseCtx(context.Background(), first, nil)
		c.extend(time.Now().Add(time.Hour))
		if time.Until(first) <= 0 { // renewed too late: the lease may have lapsed
			c.stop()
			continue
		}
		select {
		case <-c.Context.Done():
			t.Fatalf("the timer ended a renewed lease (cause %v)", context.Cause(c))
		case <-time.After(200 * time.Millisecond):
		}
		c.stop()
		return
	}
}
