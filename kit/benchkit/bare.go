package benchkit

import "context"

// Bare calls fn directly and stores nothing: the cost of the call itself and
// of the harness around it. Its rows give the overhead ratio of the others.
type Bare struct{}

// OpenBare opens the bare contender; dir is not used.
func OpenBare(context.Context, string) (Deduper, error) { return Bare{}, nil }

// Name implements Deduper.
func (Bare) Name() string { return "bare" }

// Do calls fn and never replays.
func (Bare) Do(ctx context.Context, _ string, _ []byte, fn func(context.Context) ([]byte, error)) ([]byte, bool, error) {
	resp, err := fn(ctx)
	return resp, false, err
}

// DoTx calls fn and drops its effect.
func (Bare) DoTx(ctx context.Context, _ string, _ []byte, fn TxFunc) ([]byte, bool, error) {
	_, resp, err := fn(ctx)
	return resp, false, err
}

// Preload stores nothing.
func (Bare) Preload(context.Context, RecordSet) error { return nil }

// Close does nothing.
func (Bare) Close() error { return nil }

func (Bare) stateless() {}
