package idempg

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idemcore"
)

// TestBreakerKeysAtTheLimit: keys of exactly MaxKeyLen bytes (multi-byte
// runes) are stored and replayed through Do and DoTx on a hooked pool and
// on PgBouncer; keys one byte longer, with NUL or invalid UTF-8 are refused
// with ErrInvalidKey without running fn, also when they arrive among good
// keys at once (sharing their batches would fail the batch's statement).
func TestBreakerKeysAtTheLimit(t *testing.T) {
	for _, env := range breakerEnvs {
		t.Run(env, func(t *testing.T) {
			e, _ := breakerHooked(t, env, Options{}, 0)
			ctx := context.Background()
			long := func(c string) string { // 255 bytes
				return strings.Repeat("€", 84) + c + strings.Repeat("y", 3-len(c)) // 252 + 3 bytes
			}
			good := []string{long("a"), long("b"), long("é"), strings.Repeat("z", idemcore.MaxKeyLen)}
			for _, k := range good {
				if len(k) != idemcore.MaxKeyLen {
					t.Fatalf("test key of %d bytes", len(k))
				}
			}
			bad := []string{strings.Repeat("z", idemcore.MaxKeyLen+1), "nul\x00key", "bad\xffutf8", "\xc3", long("a") + "x"}
			var ran atomic.Int32
			call := func(key string, viaTx bool) (idemcore.Result, error) {
				if viaTx {
					return e.DoTx(ctx, key, nil, func(context.Context, pgx.Tx) ([]byte, error) { ran.Add(1); return []byte(key), nil })
				}
				return e.Do(ctx, key, nil, func(context.Context) ([]byte, error) { ran.Add(1); return []byte(key), nil })
			}
			var wg sync.WaitGroup
			for i, k := range good {
				for range 8 {
					wg.Go(func() {
						res, err := call(k, i%2 == 1)
						if err != nil || string(res.Response) != k {
							t.Errorf("key of %d bytes: %+v, %v", len(k), res, err)
						}
					})
				}
			}
			for i, k := range bad {
				for range 4 {
					wg.Go(func() {
						if _, err := call(k, i%2 == 1); !errors.Is(err, idemcore.ErrInvalidKey) {
							t.Errorf("bad key %q: %v, want ErrInvalidKey", k, err)
						}
					})
				}
			}
			wg.Wait()
			if n := ran.Load(); n != int32(len(good)) {
				t.Errorf("fn ran %d times, want %d (once per good key)", n, len(good))
			}
			for _, k := range good {
				r, err := e.Get(k)
				if err != nil || r.State != idemcore.StateDone || string(r.Response) != k {
					t.Errorf("Get of a %d-byte key: %+v, %v", len(k), r, err)
				}
			}
		})
	}
}
