package testkit

import (
	"context"
	"sync"

	"github.com/idemkit/idem"
)

// Recorder records every delivery attempt an outbox handler sees, in order,
// and whether it succeeded. The zero value is ready; it is safe for
// concurrent handlers.
type Recorder struct {
	mu  sync.Mutex
	got []idem.Message
	ok  []bool
}

// Handler records each message and returns fail(m) (nil fail: success).
func (r *Recorder) Handler(fail func(m idem.Message) error) idem.Handler {
	return func(ctx context.Context, m idem.Message) error {
		var err error
		if fail != nil {
			err = fail(m)
		}
		r.mu.Lock()
		r.got, r.ok = append(r.got, m), append(r.ok, err == nil)
		r.mu.Unlock()
		return err
	}
}

// Attempts returns every message handed to the handler, in order.
func (r *Recorder) Attempts() []idem.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]idem.Message(nil), r.got...)
}

// Delivered returns the messages whose attempt succeeded, in order.
func (r *Recorder) Delivered() []idem.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []idem.Message
	for i, m := range r.got {
		if r.ok[i] {
			out = append(out, m)
		}
	}
	return out
}

// Log returns every attempt in order and, beside each, whether it
// succeeded.
func (r *Recorder) Log() ([]idem.Message, []bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]idem.Message(nil), r.got...), append([]bool(nil), r.ok...)
}
