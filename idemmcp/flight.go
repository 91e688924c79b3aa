package idemmcp

import (
	"context"
	"time"
)

// Calls running in this middleware, and their duplicates.

// flight is a call running in this middleware, for its duplicates.
type flight struct {
	fp   string
	done chan struct{}
}

// enter takes the key in this middleware, or waits for (or refuses because
// of) the running call with it. A call with another fingerprint goes on: the
// engine refuses it as a conflict.
func (m *Middleware) enter(ctx context.Context, key, fp string) (release func(), err error) {
	var deadline <-chan time.Time
	for {
		m.mu.Lock()
		f := m.flights[key]
		if f == nil {
			f = &flight{fp: fp, done: make(chan struct{})}
			m.flights[key] = f
			m.mu.Unlock()
			return func() {
				m.mu.Lock()
				delete(m.flights, key)
				m.mu.Unlock()
				close(f.done)
			}, nil
		}
		m.mu.Unlock()
		if f.fp != fp {
			return func() {}, nil
		}
		if m.opts.InProgress == InProgressRefuse {
			return nil, m.inProgress(m.opts.RetryAfter)
		}
		if waitHook != nil {
			waitHook()
		}
		if deadline == nil {
			timer := time.NewTimer(m.opts.MaxWait)
			defer timer.Stop()
			deadline = timer.C
		}
		select {
		case <-f.done:
		case <-deadline:
			return nil, m.inProgress(m.opts.RetryAfter)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// waitHook, if set (by tests), runs when a duplicate starts waiting.
var waitHook func()

func (m *Middleware) inProgress(after time.Duration) error {
	return refuse(TypeInProgress, after, "the first call with this key is still running")
}
