package testkit

import (
	"context"
	"sync"

	"github.com/idemkit/idem/idemcore"
)

// Recorder records every delivery attempt an outbox handler sees, in order,
// and whether it succeeded. The zero value is ready; it is safe for
// concurrent handlers.
type Recorder struct {
	mu  sync.Mutex
	got []idemcore.Message
	ok  []bool
}

// Handler records each message and returns fail(m) (nil fail: success).
func (r *Recorder) Handler(fail func(m idemcore.Message) error) idemcore.Handler {
	return func(ctx context.Context, m idemcore.Message) error {
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
func (r *Recorder) Attempts() []idemcore.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]idemcore.Message(nil), r.got...)
}

// Delivered returns the messages whose attempt succeeded, in order.
func (r *Recorder) Delivered() []idemcore.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []idemcore.Message
	for i, m := range r.got {
		if r.ok[i] {
			out = append(out, m)
		}
	}
	return out
}

// Log returns every attempt in order and, beside each, whether it
// succeeded.
func (r *Recorder) Log() ([]idemcore.Message, []bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]idemcore.Message(nil), r.got...), append([]bool(nil), r.ok...)
}
