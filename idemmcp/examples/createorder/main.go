// Command createorder is an MCP server over stdio whose create_order tool is
// behind idem: an agent that re-sends create_order after a lost response,
// with the same idempotency key in _meta, gets the first order back (marked
// as a replay in the result's _meta) and the customer has one order. The
// order and the idempotency record commit in one bbolt transaction (the
// DoTx tool form), so a kill at any point leaves both or neither.
//
//	go run ./examples/createorder -db orders.db
//
// An MCP client starts it as a stdio server; a go-sdk client sends the key
// with idemmcp.ClientMiddleware and idemmcp.WithKey, any other client puts
// it in the request's _meta as "io.github.idemkit/idempotency-key".
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.etcd.io/bbolt"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemmcp"
)

func main() {
	db := flag.String("db", "orders.db", "the bbolt file of orders and idempotency records")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := serve(ctx, *db, &mcp.StdioTransport{}); err != nil {
		log.Fatal(err)
	}
}

// Order is what create_order takes.
type Order struct {
	Customer string `json:"customer" jsonschema:"the customer's id"`
	SKU      string `json:"sku" jsonschema:"the product"`
	Qty      int    `json:"qty" jsonschema:"how many, at least 1"`
}

// Created is what create_order answers.
type Created struct {
	OrderID string `json:"order_id"`
	Order
}

var ordersBucket = []byte("orders")

// serve runs the server over t until the client disconnects.
func serve(ctx context.Context, path string, t mcp.Transport) error {
	e, err := idem.Open(path, nil)
	if err != nil {
		return err
	}
	defer e.Close()
	s := mcp.NewServer(&mcp.Implementation{Name: "createorder", Version: "v1"}, nil)
	m := idemmcp.New(e, nil)
	idemmcp.AddTxTool(s, m, idem.TxDoer[*idem.Tx](e),
		&mcp.Tool{Name: "create_order", Description: "Create an order. Send an idempotency key in _meta: a retry with it returns the same order."},
		createOrder, nil)
	idemmcp.AddTool(s, m,
		&mcp.Tool{Name: "list_orders", Description: "List every order.", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		listOrders(e), nil)
	s.AddReceivingMiddleware(m.Wrap)
	return s.Run(ctx, t)
}

// createOrder writes the order through tx only: it commits with the key's
// record, or not at all.
func createOrder(_ context.Context, _ *mcp.CallToolRequest, in Order, tx *idem.Tx) (*mcp.CallToolResult, Created, error) {
	if in.Qty < 1 {
		return nil, Created{}, fmt.Errorf("qty must be at least 1, not %d", in.Qty)
	}
	b, err := tx.Bucket(ordersBucket)
	if err != nil {
		return nil, Created{}, err
	}
	seq, err := b.NextSequence()
	if err != nil {
		return nil, Created{}, err
	}
	out := Created{OrderID: fmt.Sprintf("ord_%d", seq), Order: in}
	data, err := json.Marshal(out)
	if err != nil {
		return nil, Created{}, err
	}
	return nil, out, b.Put([]byte(out.OrderID), data)
}

// Orders is what list_orders answers.
type Orders struct {
	Orders []Created `json:"orders"`
}

func listOrders(e *idem.Engine) mcp.ToolHandlerFor[struct{}, Orders] {
	return func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, Orders, error) {
		out := Orders{Orders: []Created{}}
		err := e.View(func(tx *bbolt.Tx) error {
			b := tx.Bucket(ordersBucket)
			if b == nil {
				return nil
			}
			return b.ForEach(func(_, v []byte) error {
				var o Created
				if err := json.Unmarshal(v, &o); err != nil {
					return err
				}
				out.Orders = append(out.Orders, o)
				return nil
			})
		})
		return nil, out, err
	}
}
