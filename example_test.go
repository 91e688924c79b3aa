package idem_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/idemkit/idem"
)

// An agent's tool loop retries create_order after timeouts: the first attempt
// charges the card but its answer is lost, the retry gets the recorded answer,
// and the customer is charged once.
func ExampleEngine_Do() {
	dir, _ := os.MkdirTemp("", "idem-example")
	defer os.RemoveAll(dir)
	e, err := idem.Open(filepath.Join(dir, "idem.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer e.Close()

	charges := 0
	createOrder := func(ctx context.Context) ([]byte, error) {
		charges++ // the side effect
		return []byte(`{"order_id":"ord_1","total":42.5}`), nil
	}
	args := map[string]any{"customer": "cus_9", "sku": "A1", "qty": 2}
	fp, _ := idem.Fingerprint(args)

	// The agent mints one key per intent and reuses it on every retry.
	const key = "call_7f3a"
	for attempt := 1; attempt <= 3; attempt++ {
		res, err := e.Do(context.Background(), key, fp, createOrder)
		if err != nil {
			log.Fatal(err)
		}
		if attempt < 3 {
			continue // the response was "lost": a timeout, the agent retries
		}
		fmt.Printf("%s replayed=%v\n", res.Response, res.Replayed)
	}
	fmt.Println("charges:", charges)

	// The same key with other arguments is refused.
	other, _ := idem.Fingerprint(map[string]any{"customer": "cus_9", "sku": "A1", "qty": 3})
	_, err = e.Do(context.Background(), key, other, createOrder)
	fmt.Println(errors.Is(err, idem.ErrFingerprintMismatch))
	// Output:
	// {"order_id":"ord_1","total":42.5} replayed=true
	// charges: 1
	// true
}

// A permanent error is recorded and replayed with its code, the way Stripe
// replays its own errors; an error marked Retryable frees the key instead.
func ExampleWithCode() {
	dir, _ := os.MkdirTemp("", "idem-example")
	defer os.RemoveAll(dir)
	e, _ := idem.Open(filepath.Join(dir, "idem.db"), nil)
	defer e.Close()

	declined := func(context.Context) ([]byte, error) {
		return nil, idem.WithCode(errors.New("insufficient funds"), "card_declined")
	}
	for range 2 {
		res, err := e.Do(context.Background(), "charge-1", nil, declined)
		var ie *idem.Error
		if errors.As(err, &ie) {
			fmt.Printf("code=%s message=%q replayed=%v\n", ie.Code, ie.Message, res.Replayed)
		}
	}

	busy := func(context.Context) ([]byte, error) {
		return nil, idem.Retryable(errors.New("gateway busy, nothing charged"))
	}
	_, err := e.Do(context.Background(), "charge-2", nil, busy)
	fmt.Println(errors.Is(err, idem.ErrRetryable))
	res, _ := e.Do(context.Background(), "charge-2", nil, func(context.Context) ([]byte, error) {
		return []byte("charged"), nil
	})
	fmt.Printf("%s replayed=%v\n", res.Response, res.Replayed)
	// Output:
	// code=card_declined message="insufficient funds" replayed=false
	// code=card_declined message="insufficient funds" replayed=true
	// true
	// charged replayed=false
}

// DoJSON records a typed result; the fingerprint is the canonical JSON of the
// arguments, whatever their map order.
func ExampleDoJSON() {
	dir, _ := os.MkdirTemp("", "idem-example")
	defer os.RemoveAll(dir)
	e, _ := idem.Open(filepath.Join(dir, "idem.db"), nil)
	defer e.Close()

	type Refund struct {
		ID     string  `json:"id"`
		Amount float64 `json:"amount"`
	}
	refund := func(context.Context) (Refund, error) { return Refund{"re_1", 19.99}, nil }

	r1, _, _ := idem.DoJSON(context.Background(), e, "refund-1", map[string]any{"order": "#W1", "amount": 19.99}, refund)
	r2, res, _ := idem.DoJSON(context.Background(), e, "refund-1", map[string]any{"amount": 19.99, "order": "#W1"}, refund)
	fmt.Println(r1 == r2, res.Replayed, r2.ID)
	// Output: true true re_1
}

// After a crash, fn learns that it recovers an interrupted execution and
// reconciles with the downstream system before acting again.
func ExampleCallFrom() {
	charged := map[string]bool{} // the payment gateway's ledger, by idempotency key
	createOrder := func(ctx context.Context) ([]byte, error) {
		call, _ := idem.CallFrom(ctx)
		if call.Recovered && charged[call.Key] {
			// An earlier attempt was interrupted after its effect: the
			// gateway has the charge, so reconcile instead of charging again.
			return fmt.Appendf(nil, "attempt %d: found attempt %d's charge", call.Attempt, call.Attempt-1), nil
		}
		charged[call.Key] = true
		return fmt.Appendf(nil, "attempt %d: charged", call.Attempt), nil
	}
	dir, _ := os.MkdirTemp("", "idem-example")
	defer os.RemoveAll(dir)
	e, _ := idem.Open(filepath.Join(dir, "idem.db"), nil)
	defer e.Close()

	// The first call charges the card, then its caller gives up before the
	// outcome is recorded (as a crash would cut it): an interrupted execution.
	ctx, cancel := context.WithCancel(context.Background())
	_, err := e.Do(ctx, "order-7f3a", nil, func(ctx context.Context) ([]byte, error) {
		if _, err := createOrder(ctx); err != nil {
			return nil, err
		}
		cancel()
		return nil, ctx.Err()
	})
	fmt.Println("first call interrupted:", errors.Is(err, context.Canceled))
	// The retry recovers it: Recovered is set, and fn reconciles.
	res, _ := e.Do(context.Background(), "order-7f3a", nil, createOrder)
	fmt.Println(string(res.Response))
	fmt.Println("charges:", len(charged))
	// Output:
	// first call interrupted: true
	// attempt 2: found attempt 1's charge
	// charges: 1
}
