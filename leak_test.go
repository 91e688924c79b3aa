package idem_test

import (
	"context"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit/boltkit"
)

// Every registration a call makes (the context.AfterFunc that ends fn's
// context on Close, the flight of its key) is released on every path: calls
// whose fn panics or calls runtime.Goexit leave the heap and the goroutine
// count as they found them.
func TestCallsThatPanicOrExitLeakNothing(t *testing.T) {
	const calls = 10_000
	ends := map[string]func(){
		"panic":  func() { panic("boom") },
		"Goexit": runtime.Goexit,
	}
	for endName, end := range ends {
		for _, op := range []string{"Do", "DoTx"} {
			t.Run(op+" "+endName, func(t *testing.T) {
				e, _ := boltkit.OpenFile(t, &idem.BoltOptions{NoSync: true}, &idem.Options{PruneInterval: -1})
				call := func() {
					done := make(chan struct{})
					go func() { // Goexit ends the goroutine it runs on
						defer close(done)
						defer func() { _ = recover() }()
						if op == "Do" {
							_, _ = e.Do(bg, "k", nil, func(context.Context) ([]byte, error) { end(); return nil, nil })
						} else {
							_, _ = e.DoTx(bg, "k", nil, func(context.Context, *idem.Tx) ([]byte, error) { end(); return nil, nil })
						}
					}()
					<-done
				}
				for range 500 { // warm up: the file, bbolt's freelist, pools
					call()
				}
				heap0, goroutines0 := heapAndGoroutines()
				for range calls {
					call()
				}
				heap1, goroutines1 := heapAndGoroutines()
				t.Logf("heap %d -> %d bytes, goroutines %d -> %d", heap0, heap1, goroutines0, goroutines1)
				require.Less(t, int64(heap1)-int64(heap0), int64(calls*32), "heap grows with the calls made")
				require.Equal(t, goroutines0, goroutines1, "goroutines left behind")
				res, err := e.Do(bg, "other", nil, okFn("v"))
				require.NoError(t, err, "the engine still works")
				require.Equal(t, "v", string(res.Response))
			})
		}
	}
}

// heapAndGoroutines settles the heap and returns the bytes in use and the
// goroutine count; goroutines that are ending (a Goexit's) get to finish.
func heapAndGoroutines() (heap uint64, goroutines int) {
	var ms runtime.MemStats
	for range 3 {
		runtime.GC()
	}
	runtime.ReadMemStats(&ms)
	for range 100 {
		runtime.Gosched()
	}
	return ms.HeapAlloc, runtime.NumGoroutine()
}
