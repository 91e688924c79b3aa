package idem_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
)

// create_order: the order, the intent to charge the card and
// the idempotency key commit in one transaction; the dispatcher then charges
// the card, at least once, passing the message's downstream key on, so a
// gateway that dedupes by key charges once however often the client retries.
func ExampleTx_Enqueue() {
	dir, _ := os.MkdirTemp("", "idem-example")
	defer os.RemoveAll(dir)

	// A fake payment gateway that counts the charges per idempotency key.
	var mu sync.Mutex
	charges := map[string]int{}
	charged := make(chan struct{}, 1)
	chargeCard := func(ctx context.Context, m idem.Message) error {
		mu.Lock()
		charges[m.DownstreamKey]++
		mu.Unlock()
		charged <- struct{}{}
		return nil
	}

	e, err := idem.Open(filepath.Join(dir, "shop.db"), &idem.Options{Outbox: idem.OutboxOptions{
		Dispatch: true,
		Handlers: map[string]idem.Handler{"charge_card": chargeCard},
	}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer e.Close()

	createOrder := func(ctx context.Context, customer, sku string, cents int) (string, bool, error) {
		key := idem.KeyOf("create_order", customer, sku, "2025-01-02")
		res, err := e.DoTx(ctx, key, fmt.Appendf(nil, "%d", cents), func(ctx context.Context, tx *idem.Tx) ([]byte, error) {
			orders, err := tx.Bucket([]byte("orders"))
			if err != nil {
				return nil, err
			}
			n, _ := orders.NextSequence()
			id := fmt.Sprintf("order-%d", n)
			if err := orders.Put([]byte(id), fmt.Appendf(nil, "%s %s %d", customer, sku, cents)); err != nil {
				return nil, err
			}
			return []byte(id), tx.Enqueue("charge_card", fmt.Appendf(nil, `{"order":%q,"cents":%d}`, id, cents))
		})
		return string(res.Response), res.Replayed, err
	}

	ctx := context.Background()
	for range 3 { // the client retries, say after timeouts
		id, replayed, err := createOrder(ctx, "customer-8812", "sku-A1", 1200)
		fmt.Println(id, "replayed:", replayed, "err:", err)
	}
	<-charged
	mu.Lock()
	for _, n := range charges {
		fmt.Println("charges for the order's key:", n)
	}
	mu.Unlock()
	// Output:
	// order-1 replayed: false err: <nil>
	// order-1 replayed: true err: <nil>
	// order-1 replayed: true err: <nil>
	// charges for the order's key: 1
}

func ExampleKeyOf() {
	key := idem.KeyOf("create_order", "customer-8812", "sku-A1", "2025-01-02")
	fmt.Println(key)
	fmt.Println(len(key), "bytes; the customer id is not in it")
	// Output:
	// create_order:93e8c01257dbc00b58c399674a8e69c2c7513570ecd5f21eedb9e31530bbfebd
	// 77 bytes; the customer id is not in it
}

// Operators list the dead letters, fix the cause, and retry or drop them
// (the CLI's `idem outbox ls|retry|drop` does the same on a file no program
// holds).
func ExampleEngine_RetryDead() {
	dir, _ := os.MkdirTemp("", "idem-example")
	defer os.RemoveAll(dir)

	var gatewayUp atomic.Bool
	delivered := make(chan string, 1)
	e, err := idem.Open(filepath.Join(dir, "shop.db"), &idem.Options{Outbox: idem.OutboxOptions{
		Dispatch:    true,
		MaxAttempts: 1, // dead at the first failure, for the example
		Handlers: map[string]idem.Handler{"charge_card": func(ctx context.Context, m idem.Message) error {
			if !gatewayUp.Load() {
				return errors.New("gateway down")
			}
			delivered <- m.DownstreamKey
			return nil
		}},
	}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer e.Close()
	_, _ = e.DoTx(context.Background(), "order-1", nil, func(ctx context.Context, tx *idem.Tx) ([]byte, error) {
		return nil, tx.Enqueue("charge_card", []byte(`{"cents":1200}`))
	})
	for s, _ := e.ScanFile(); s.Outbox.Dead == 0; s, _ = e.ScanFile() {
		time.Sleep(time.Millisecond) // the dispatcher works in the background
	}

	var dead []uint64
	_ = e.Messages(func(m *idem.Message, err error) error {
		if err == nil && m.Dead {
			fmt.Printf("dead letter %d: %s %s after %d attempt(s): %s\n", m.Seq, m.Topic, m.DownstreamKey, m.Failures, m.LastError)
			dead = append(dead, m.Seq)
		}
		return nil
	})
	gatewayUp.Store(true) // the cause is fixed
	for _, seq := range dead {
		if err := e.RetryDead(seq); err != nil {
			fmt.Println(err)
		}
	}
	fmt.Println("charged with key", <-delivered)
	// Output:
	// dead letter 1: charge_card order-1/0 after 1 attempt(s): gateway down
	// charged with key order-1/0
}
