package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemmcp"
	"github.com/idemkit/idem/kit/taubench"
)

// TestTaubenchViaMCP plays two tasks over MCP through the command, with the
// tool servers as children of the test binary (its init runs ChildMain).
func TestTaubenchViaMCP(t *testing.T) {
	// Under the race detector each child would sleep a second at exit.
	t.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	data := taubench.DefaultDataDir(filepath.Join("..", ".."))
	r := idemCmd(t, nil, "", "taubench", "--via", "mcp", "--limit", "2", "--seed", "3", "--data", data)
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	for _, s := range taubench.Schedules {
		require.Contains(t, r.stdout, "| "+string(s)+" | idem | 2/2 | 0 | 0 |")
	}
	require.Contains(t, r.stdout, "--via=mcp")
}

func TestTaubenchViaUnknown(t *testing.T) {
	data := taubench.DefaultDataDir(filepath.Join("..", ".."))
	r := idemCmd(t, nil, "", "taubench", "--via", "carrier-pigeon", "--data", data)
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, `--via must be direct or mcp, not "carrier-pigeon"`)
}

// TestTaubenchServe drives `idem taubench serve` with a go-sdk client over
// its stdin and stdout, with and without idem.
func TestTaubenchServe(t *testing.T) {
	data := taubench.DefaultDataDir(filepath.Join("..", ".."))
	for _, withIdem := range []bool{true, false} {
		t.Run(fmt.Sprintf("idem=%v", withIdem), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "shop.db")
			inR, inW := io.Pipe()
			outR, outW := io.Pipe()
			done := make(chan result, 1)
			go func() {
				var stderr bytes.Buffer
				code := run(t.Context(), []string{"--db", path, "taubench", "serve", "--data", data, fmt.Sprintf("--idem=%v", withIdem)},
					func(string) string { return "" }, inR, outW, &stderr)
				outW.Close()
				done <- result{code: code, stderr: stderr.String()}
			}()
			client := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil)
			client.AddSendingMiddleware(idemmcp.ClientMiddleware(nil))
			cs, err := client.Connect(t.Context(), &mcp.IOTransport{Reader: outR, Writer: inW}, nil)
			require.NoError(t, err)
			var tools []string
			for tool, err := range cs.Tools(t.Context(), nil) {
				require.NoError(t, err)
				tools = append(tools, tool.Name)
			}
			require.Len(t, tools, 16)
			args := map[string]any{"order_id": "#W5918442", "address1": "1 Main St", "address2": "", "city": "Austin",
				"state": "TX", "country": "USA", "zip": "78701"}
			ctx := idemmcp.WithKey(t.Context(), "intent-1")
			var answers []*mcp.CallToolResult
			for range 2 {
				res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "modify_pending_order_address", Arguments: args})
				require.NoError(t, err)
				answers = append(answers, res)
			}
			require.Equal(t, withIdem, idemmcp.Replayed(answers[1]))
			require.NoError(t, cs.Close())
			r := <-done
			require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
		})
	}
}
