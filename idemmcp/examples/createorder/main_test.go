package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemmcp"
)

// envServe makes the test binary, re-executed, the stdio server on a file.
const envServe = "CREATEORDER_TEST_SERVE"

func TestMain(m *testing.M) {
	if path := os.Getenv(envServe); path != "" {
		if err := serve(context.Background(), path, &mcp.StdioTransport{}); err != nil {
			os.Exit(3)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// connect starts the server as a child process over stdio on path, as an
// MCP host would, and connects a go-sdk client that sends keys.
func connect(t *testing.T, path string) (*mcp.ClientSession, *exec.Cmd) {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe)
	// Under the race detector the child would sleep a second at exit.
	cmd.Env = append(os.Environ(), envServe+"="+path, "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	client := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil)
	client.AddSendingMiddleware(idemmcp.ClientMiddleware(nil))
	cs, err := client.Connect(t.Context(), &mcp.CommandTransport{Command: cmd}, nil)
	require.NoError(t, err)
	return cs, cmd
}

func orderOf(t *testing.T, res *mcp.CallToolResult) Created {
	t.Helper()
	require.False(t, res.IsError, "%v", res.Content)
	var c Created
	require.NoError(t, json.Unmarshal([]byte(res.Content[0].(*mcp.TextContent).Text), &c))
	return c
}

func TestRetriedCreateOrderIsOneOrder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "orders.db")
	cs, _ := connect(t, path)
	ctx := idemmcp.WithKey(t.Context(), "intent-7f3a") // once per logical intent
	args := map[string]any{"customer": "cus_9", "sku": "A1", "qty": 2}
	var first Created
	for attempt := range 3 { // the agent retries after timeouts
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "create_order", Arguments: args})
		require.NoError(t, err)
		o := orderOf(t, res)
		if attempt == 0 {
			first = o
			require.False(t, idemmcp.Replayed(res))
		} else {
			require.Equal(t, first, o)
			require.True(t, idemmcp.Replayed(res))
		}
	}
	require.NoError(t, cs.Close())

	// Restarted on the same file, the server still answers the retry from
	// the record, and there is one order.
	cs, _ = connect(t, path)
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "create_order", Arguments: args})
	require.NoError(t, err)
	require.Equal(t, first, orderOf(t, res))
	require.True(t, idemmcp.Replayed(res))
	list, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "list_orders"})
	require.NoError(t, err)
	var orders Orders
	require.NoError(t, json.Unmarshal([]byte(list.Content[0].(*mcp.TextContent).Text), &orders))
	require.Equal(t, []Created{first}, orders.Orders)
}

func TestKilledServerLeavesNoExtraOrder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "orders.db")
	cs, cmd := connect(t, path)
	ctx := idemmcp.WithKey(t.Context(), "intent-1")
	args := map[string]any{"customer": "cus_9", "sku": "A1", "qty": 1}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "create_order", Arguments: args})
	require.NoError(t, err)
	first := orderOf(t, res)
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL)) // the answer may be lost with it
	_ = cs.Close()

	cs, _ = connect(t, path)
	defer cs.Close()
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "create_order", Arguments: args})
	require.NoError(t, err)
	require.Equal(t, first, orderOf(t, res))
	list, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "list_orders"})
	require.NoError(t, err)
	var orders Orders
	require.NoError(t, json.Unmarshal([]byte(list.Content[0].(*mcp.TextContent).Text), &orders))
	require.Len(t, orders.Orders, 1)
}
