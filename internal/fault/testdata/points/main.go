// Command points runs through every failpoint of the engine (Do, DoTx, the
// outbox dispatcher) and two of its own (fault.Point and fault.Err), then
// prints "passed every point". TestFailpointsOnlyInTaggedBuilds builds it
// with and without the idemfail tag and runs it with IDEM_FAILPOINT set.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/fault"
)

func main() {
	if err := run(); err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Println("passed every point")
}

func run() error {
	dir, err := os.MkdirTemp("", "idem-points-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	delivered := make(chan struct{}, 1)
	e, err := idem.OpenFile(filepath.Join(dir, "idem.db"), &idem.BoltOptions{NoSync: true}, &idem.Options{Outbox: idem.OutboxOptions{
		Dispatch:     true,
		PollInterval: time.Millisecond,
		Handlers: map[string]idem.Handler{"t": func(context.Context, idem.Message) error {
			delivered <- struct{}{}
			return nil
		}},
	}})
	if err != nil {
		return err
	}
	defer e.Close()
	ctx := context.Background()
	if _, err := e.Do(ctx, "do", nil, func(context.Context) ([]byte, error) { return []byte("ok"), nil }); err != nil {
		return err
	}
	if _, err := e.DoTx(ctx, "dotx", nil, func(_ context.Context, tx *idem.Tx) ([]byte, error) {
		return []byte("ok"), tx.Enqueue("t", nil)
	}); err != nil {
		return err
	}
	<-delivered
	for { // until the dispatcher has passed outbox-after-handler
		s, err := e.ScanFile()
		if err != nil {
			return err
		}
		if s.Outbox.Pending == 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	fault.Point("points-point")
	fmt.Println("points-point took at least 20ms:", time.Since(start) >= 20*time.Millisecond)
	if err := fault.Err("points-err"); err != nil {
		return err
	}
	return nil
}
