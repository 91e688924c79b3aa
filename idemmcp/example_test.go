package idemmcp_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemmcp"
)

// An agent's loop re-sends create_order with the same key after a lost
// answer: the tool runs once and the retry is a replay.
func Example() {
	dir, _ := os.MkdirTemp("", "idemmcp-example")
	defer os.RemoveAll(dir)
	e, err := idem.Open(filepath.Join(dir, "idem.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer e.Close()

	// The server: create_order behind the middleware.
	orders := 0
	server := mcp.NewServer(&mcp.Implementation{Name: "shop", Version: "v1"}, nil)
	m := idemmcp.New(e, nil)
	idemmcp.AddTool(server, m, &mcp.Tool{Name: "create_order"},
		func(_ context.Context, _ *mcp.CallToolRequest, in struct {
			SKU string `json:"sku"`
		}) (*mcp.CallToolResult, map[string]string, error) {
			orders++ // the side effect
			return nil, map[string]string{"order_id": fmt.Sprintf("ord_%d", orders)}, nil
		}, nil)
	server.AddReceivingMiddleware(m.Wrap)

	// The agent: a go-sdk client that sends the context's key.
	ctx := context.Background()
	st, ct := mcp.NewInMemoryTransports()
	if _, err := server.Connect(ctx, st, nil); err != nil {
		log.Fatal(err)
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil)
	client.AddSendingMiddleware(idemmcp.ClientMiddleware(nil))
	cs, err := client.Connect(ctx, ct, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer cs.Close()

	intent := idemmcp.WithKey(ctx, "call_7f3a") // once per logical intent
	for range 2 {
		res, err := cs.CallTool(intent, &mcp.CallToolParams{Name: "create_order", Arguments: map[string]any{"sku": "A1"}})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(res.Content[0].(*mcp.TextContent).Text, "replayed:", idemmcp.Replayed(res))
	}
	fmt.Println("orders:", orders)
	// Output:
	// {"order_id":"ord_1"} replayed: false
	// {"order_id":"ord_1"} replayed: true
	// orders: 1
}
