// Command createorder is create_order (ExampleTx_Enqueue), runnable: a
// client that retries through timeouts, a service that records the order, the
// intent to charge the card and the idempotency key in one transaction, and a
// payment gateway reached through the outbox. However often the client retries and
// however often the gateway's answer is lost, the customer has one order and
// is charged once.
//
//	go run ./examples/createorder
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"sync"
	"time"

	"go.etcd.io/bbolt"

	"github.com/idemkit/idem"
)

func main() {
	dir, err := os.MkdirTemp("", "createorder")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	gw := newGateway()
	e, err := idem.Open(filepath.Join(dir, "shop.db"), &idem.Options{Outbox: idem.OutboxOptions{
		Dispatch:    true,
		BaseBackoff: 50 * time.Millisecond, // short, for the demonstration
		Handlers: map[string]idem.Handler{
			// The handler passes the message's downstream key on as the
			// gateway's Idempotency-Key.
			"charge_card": func(ctx context.Context, m idem.Message) error {
				return gw.Charge(ctx, m.DownstreamKey, m.Payload)
			},
		},
	}})
	if err != nil {
		log.Fatal(err)
	}
	defer e.Close()
	svc := &service{e: e}

	// The client: its first two requests time out (the service did the work,
	// the response was lost), so it retries with the same idempotency key.
	ctx := context.Background()
	key := idem.KeyOf("create_order", "customer-8812", "sku-A1", "2025-01-02")
	for attempt := 1; ; attempt++ {
		id, replayed, err := svc.CreateOrder(ctx, key, "customer-8812", "sku-A1", 1200, attempt <= 2)
		if errors.Is(err, errTimeout) {
			fmt.Printf("client: attempt %d: %v, retrying with the same key\n", attempt, err)
			continue
		}
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("client: attempt %d: %s (replayed: %v)\n", attempt, id, replayed)
		break
	}

	gw.WaitCharged()
	for s, _ := e.ScanFile(); s.Outbox.Pending > 0; s, _ = e.ScanFile() {
		time.Sleep(10 * time.Millisecond) // let the dispatcher remove the delivered message
	}
	orders, _ := svc.Orders(ctx)
	calls, charged := gw.Counts()
	fmt.Printf("orders in the file: %d\n", orders)
	fmt.Printf("gateway: %d calls, %d charge(s) of customer-8812\n", calls, charged)
}

var errTimeout = errors.New("timeout waiting for the response")

// service is the order service: create_order in a dozen lines.
type service struct{ e *idem.Engine }

func (s *service) CreateOrder(ctx context.Context, key, customer, sku string, cents int, loseResponse bool) (string, bool, error) {
	res, err := s.e.DoTx(ctx, key, fmt.Appendf(nil, "%s|%s|%d", customer, sku, cents), func(ctx context.Context, tx *idem.Tx) ([]byte, error) {
		orders, err := tx.Bucket([]byte("orders"))
		if err != nil {
			return nil, err
		}
		n, _ := orders.NextSequence()
		id := fmt.Sprintf("order-%d", n)
		if err := orders.Put([]byte(id), fmt.Appendf(nil, "%s %s %d", customer, sku, cents)); err != nil {
			return nil, err
		}
		return []byte(id), tx.Enqueue("charge_card", fmt.Appendf(nil, `{"order":%q,"customer":%q,"cents":%d}`, id, customer, cents))
	})
	if loseResponse {
		return "", false, errTimeout // the work is committed; only the answer is lost
	}
	return string(res.Response), res.Replayed, err
}

// Orders counts the orders in the file, in a read transaction.
func (s *service) Orders(ctx context.Context) (int, error) {
	n := 0
	err := s.e.View(func(tx *bbolt.Tx) error {
		if orders := tx.Bucket([]byte("orders")); orders != nil {
			n = orders.Stats().KeyN
		}
		return nil
	})
	return n, err
}

// gateway is a fake payment gateway that dedupes by Idempotency-Key, as
// Stripe does. Its first answer is lost on the way back (a timeout), so the
// dispatcher retries the charge.
type gateway struct {
	mu      sync.Mutex
	calls   int
	charges map[string]string // idempotency key → charge id
	done    chan struct{}
}

func newGateway() *gateway {
	return &gateway{charges: map[string]string{}, done: make(chan struct{})}
}

func (g *gateway) Charge(ctx context.Context, key string, payload []byte) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.calls++
	id, seen := g.charges[key]
	if !seen {
		id = fmt.Sprintf("ch_%d", len(g.charges)+1)
		g.charges[key] = id
		fmt.Printf("gateway: charged %s for %s (key %.24s…)\n", id, payload, key)
	} else {
		fmt.Printf("gateway: key seen before, returning %s again\n", id)
	}
	if g.calls == 1 {
		fmt.Println("gateway: the answer is lost on the way back")
		return errTimeout
	}
	select {
	case <-g.done:
	default:
		close(g.done)
	}
	return nil
}

func (g *gateway) WaitCharged() { <-g.done }

func (g *gateway) Counts() (calls, charged int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.calls, len(g.charges)
}
