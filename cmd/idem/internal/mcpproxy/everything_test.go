package mcpproxy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/cmd/idem/internal/npmtest"
	"github.com/idemkit/idem/idemmcp"
)

// everythingConfig protects get-sum of @modelcontextprotocol/server-everything
// (read-only in fact, but a protected call shows the path through the engine).
const everythingConfig = "tools:\n  get-sum: {}\n"

// transcript plays a fixed client script against a server process (the
// server itself, or the proxy in front of it) and records what comes back.
type transcript struct {
	// responses by request id, each as canonical JSON.
	responses map[string]string
	// others: the server's requests (without their ids) and notifications,
	// canonical, sorted (their order against the responses is the server's
	// scheduling).
	others []string
}

// lineConn speaks JSON-RPC lines with a process.
type lineConn struct {
	t     *testing.T
	in    io.WriteCloser
	lines chan []byte
}

func startLines(t *testing.T, cmd *exec.Cmd) *lineConn {
	in, err := cmd.StdinPipe()
	require.NoError(t, err)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	c := &lineConn{t: t, in: in, lines: make(chan []byte, 1000)}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 1<<24)
		for sc.Scan() {
			c.lines <- bytes.Clone(sc.Bytes())
		}
		close(c.lines)
	}()
	t.Cleanup(func() {
		_ = in.Close()
		_ = cmd.Wait()
	})
	return c
}

func (c *lineConn) send(msg string) {
	_, err := io.WriteString(c.in, msg+"\n")
	require.NoError(c.t, err)
}

// step is one message of the client's script; a request (with an id)
// waits for its response, or, with until set, for a message containing until.
type step struct {
	msg   string
	until string
}

// play runs the script, answering the server's sampling and elicitation
// requests as a client would.
func play(t *testing.T, c *lineConn, script []step) *transcript {
	tr := &transcript{responses: map[string]string{}}
	for _, st := range script {
		c.send(st.msg)
		var h struct {
			ID json.RawMessage `json:"id"`
		}
		require.NoError(t, json.Unmarshal([]byte(st.msg), &h))
		if h.ID == nil && st.until == "" {
			continue
		}
		for {
			line, ok := <-c.lines
			require.True(t, ok, "the server closed its stdout waiting for %s", st.msg)
			var m struct {
				ID     json.RawMessage `json:"id"`
				Method string          `json:"method"`
			}
			require.NoError(t, json.Unmarshal(line, &m), "%s", line)
			canon, err := Canonical(line)
			require.NoError(t, err)
			switch {
			case m.Method == "" && m.ID != nil:
				tr.responses[string(m.ID)] = string(canon)
			case m.ID != nil:
				// A server's request: its id is the server's numbering, which
				// follows its own scheduling (server-everything asks roots/list
				// at a moment of its choosing), so it is left out.
				var req map[string]json.RawMessage
				require.NoError(t, json.Unmarshal(line, &req))
				delete(req, "id")
				b, err := json.Marshal(req)
				require.NoError(t, err)
				canon, err := Canonical(b)
				require.NoError(t, err)
				tr.others = append(tr.others, string(canon))
				c.send(answerServer(m.ID, m.Method))
			default:
				tr.others = append(tr.others, string(canon))
			}
			if st.until != "" && strings.Contains(string(line), st.until) {
				break
			}
			if st.until == "" && m.Method == "" && string(m.ID) == string(h.ID) {
				break
			}
		}
	}
	sort.Strings(tr.others)
	return tr
}

// answerServer is the client's answer to a server's request.
func answerServer(id json.RawMessage, method string) string {
	result := `{}`
	switch method {
	case "sampling/createMessage":
		result = `{"role":"assistant","content":{"type":"text","text":"sampled by the test"},"model":"test-model","stopReason":"endTurn"}`
	case "elicitation/create":
		result = `{"action":"decline"}`
	case "roots/list":
		result = `{"roots":[]}`
	}
	return fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":%s}`, id, result)
}

// everythingScript exercises initialize, lists, prompts, resources, logging,
// completion, progress, cancellation, sampling, elicitation, an unknown
// method, unknown fields, and a protected call.
var everythingScript = []step{
	{msg: `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"sampling":{},"elicitation":{"form":{}},"roots":{"listChanged":true}},"clientInfo":{"name":"transcript","version":"1"},"x-unknown":{"kept":true}}}`},
	{msg: `{"jsonrpc":"2.0","method":"notifications/initialized"}`},
	{msg: `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`},
	{msg: `{"jsonrpc":"2.0","id":3,"method":"prompts/list"}`},
	{msg: `{"jsonrpc":"2.0","id":4,"method":"resources/list"}`},
	{msg: `{"jsonrpc":"2.0","id":5,"method":"resources/templates/list"}`},
	{msg: `{"jsonrpc":"2.0","id":6,"method":"resources/read","params":{"uri":"demo://resource/static/document/features.md"}}`},
	{msg: `{"jsonrpc":"2.0","id":7,"method":"prompts/get","params":{"name":"args-prompt","arguments":{"city":"Lyon"}}}`},
	{msg: `{"jsonrpc":"2.0","id":8,"method":"ping"}`},
	{msg: `{"jsonrpc":"2.0","id":"nine","method":"tools/call","params":{"name":"echo","arguments":{"message":"hello"},"x-extra":[1,2]}}`},
	{msg: `{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":"get-sum","arguments":{"a":2,"b":3},"_meta":{"io.github.idemkit/idempotency-key":"sum-1"}}}`},
	{msg: `{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"name":"trigger-long-running-operation","arguments":{"duration":0.2,"steps":2},"_meta":{"progressToken":"p11"}}}`},
	{msg: `{"jsonrpc":"2.0","id":12,"method":"tools/call","params":{"name":"trigger-sampling-request","arguments":{"prompt":"hi","maxTokens":5}}}`},
	{msg: `{"jsonrpc":"2.0","id":13,"method":"tools/call","params":{"name":"trigger-elicitation-request","arguments":{}}}`},
	{msg: `{"jsonrpc":"2.0","id":14,"method":"logging/setLevel","params":{"level":"debug"}}`},
	{msg: `{"jsonrpc":"2.0","id":15,"method":"completion/complete","params":{"ref":{"type":"ref/prompt","name":"completable-prompt"},"argument":{"name":"department","value":"E"}}}`},
	{msg: `{"jsonrpc":"2.0","id":16,"method":"no/such-method","params":{"x":1}}`},
	// Cancellation: the second long operation is cancelled after its first
	// progress; the third outlasts it, so a forwarded cancellation is the
	// only way no answer to 17 comes before 18's.
	{msg: `{"jsonrpc":"2.0","id":17,"method":"tools/call","params":{"name":"trigger-long-running-operation","arguments":{"duration":1,"steps":4},"_meta":{"progressToken":"p17"}}}`, until: `"p17"`},
	{msg: `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":17,"reason":"test"}}`},
	{msg: `{"jsonrpc":"2.0","id":18,"method":"tools/call","params":{"name":"trigger-long-running-operation","arguments":{"duration":1.5,"steps":1}}}`},
}

// TestTranscriptThroughProxyEqualsDirect plays one script against
// server-everything directly and through the proxy: every response is the
// same, ids included (the proxy answers under the client's own ids), and so is
// every server message but for the ids of the server's own requests, which
// follow its scheduling; a retry of the protected call replays.
func TestTranscriptThroughProxyEqualsDirect(t *testing.T) {
	server := npmtest.Everything(t)
	direct := play(t, startLines(t, exec.Command(server[0], server[1:]...)), everythingScript)

	f := newFixture(t)
	pc := startLines(t, f.proxyCmd(t, everythingConfig, server))
	proxied := play(t, pc, everythingScript)

	require.Len(t, direct.responses, 17, "every request but the cancelled one is answered")
	require.NotContains(t, direct.responses, "17")
	require.Contains(t, direct.responses["12"], "sampled by the test", "sampling went through")
	require.Contains(t, direct.responses["13"], "decline", "elicitation went through")
	for id, want := range direct.responses {
		require.Equal(t, want, proxied.responses[id], "the response to %s", id)
	}
	require.Len(t, proxied.responses, len(direct.responses))
	require.Equal(t, direct.others, proxied.others)

	retry := play(t, pc, []step{{msg: `{"jsonrpc":"2.0","id":"retry-10","method":"tools/call","params":{"name":"get-sum","arguments":{"b":3,"a":2.0},"_meta":{"io.github.idemkit/idempotency-key":"sum-1"}}}`}})
	var first, again struct {
		Result map[string]json.RawMessage `json:"result"`
	}
	require.NoError(t, json.Unmarshal([]byte(proxied.responses["10"]), &first))
	require.NoError(t, json.Unmarshal([]byte(retry.responses[`"retry-10"`]), &again))
	require.JSONEq(t, `{"io.github.idemkit/replayed":true}`, string(again.Result["_meta"]))
	delete(again.Result, "_meta")
	require.Equal(t, first.Result, again.Result)
}

// TestGoSDKClientThroughProxyToEverything drives server-everything through
// the proxy with the Go SDK's client.
func TestGoSDKClientThroughProxyToEverything(t *testing.T) {
	server := npmtest.Everything(t)
	f := newFixture(t)
	// server-everything outlives the Go SDK client's closing of its stdin
	// (by itself too, without the proxy) until SIGTERM: send it sooner.
	f.terminate = 2 * time.Second
	cs := f.connect(t, everythingConfig, server)
	ctx := t.Context()

	tools, err := cs.ListTools(ctx, nil)
	require.NoError(t, err)
	var names []string
	for _, tl := range tools.Tools {
		names = append(names, tl.Name)
	}
	require.Contains(t, names, "get-sum")

	r, err := callTool(ctx, cs, "echo", map[string]any{"message": "hi"}, "")
	require.NoError(t, err)
	require.Equal(t, "Echo: hi", textOf(t, r))

	first, err := callTool(ctx, cs, "get-sum", map[string]any{"a": 1, "b": 2}, "sum-k")
	require.NoError(t, err)
	require.False(t, replayed(first))
	second, err := callTool(ctx, cs, "get-sum", map[string]any{"a": 1, "b": 2}, "sum-k")
	require.NoError(t, err)
	require.True(t, replayed(second))
	require.Equal(t, textOf(t, first), textOf(t, second))
	_, err = callTool(ctx, cs, "get-sum", map[string]any{"a": 1, "b": 5}, "sum-k")
	requireRPCError(t, err, idemmcp.CodeConflict, "idempotency_key_conflict")

	// The TypeScript SDK's refusal of bad arguments is not recorded: the
	// corrected call with the same key runs.
	bad, err := callTool(ctx, cs, "get-sum", map[string]any{"a": "one", "b": 2}, "sum-k2")
	require.NoError(t, err)
	require.True(t, bad.IsError)
	good, err := callTool(ctx, cs, "get-sum", map[string]any{"a": 1, "b": 2}, "sum-k2")
	require.NoError(t, err)
	require.False(t, good.IsError)
	require.False(t, replayed(good))

	prompts, err := cs.ListPrompts(ctx, nil)
	require.NoError(t, err)
	require.NotEmpty(t, prompts.Prompts)
	res, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "demo://resource/dynamic/text/1"})
	require.NoError(t, err)
	require.NotEmpty(t, res.Contents)
	require.NoError(t, cs.Close())
	require.NotContains(t, f.stderr.String(), `"echo"`, "echo is read-only by its annotations: no warning")
}

// TestTypeScriptSDKClientThroughProxy drives the proxy (in front of
// server-everything) with the TypeScript SDK's client (testdata/npm/client.mjs).
func TestTypeScriptSDKClientThroughProxy(t *testing.T) {
	dir := npmtest.Dir(t)
	server := npmtest.Everything(t)
	f := newFixture(t)
	proxy := f.proxyCmd(t, everythingConfig, server)
	cmd := exec.Command("node", append([]string{filepath.Join(dir, "client.mjs"), proxy.Path}, proxy.Args[1:]...)...)
	cmd.Env = proxy.Env
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	require.NoError(t, err, "stderr of the proxy: %s", f.stderr.String())
	var got struct {
		Tools      []string        `json:"tools"`
		Echo       string          `json:"echo"`
		First      json.RawMessage `json:"first"`
		Second     json.RawMessage `json:"second"`
		Conflict   json.RawMessage `json:"conflict"`
		ServerName string          `json:"serverName"`
	}
	require.NoError(t, json.Unmarshal(out, &got), "%s", out)
	require.Contains(t, got.Tools, "get-sum")
	require.Equal(t, "Echo: hi", got.Echo)
	require.Equal(t, "mcp-servers/everything", got.ServerName)
	var first, second map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(got.First, &first))
	require.NoError(t, json.Unmarshal(got.Second, &second))
	require.NotContains(t, first, "_meta")
	require.JSONEq(t, `{"io.github.idemkit/replayed":true}`, string(second["_meta"]))
	require.JSONEq(t, string(first["content"]), string(second["content"]))
	var conflict struct {
		Code int `json:"code"`
		Data struct {
			Type string `json:"type"`
		} `json:"data"`
	}
	require.NoError(t, json.Unmarshal(got.Conflict, &conflict), "%s", got.Conflict)
	require.Equal(t, idemmcp.CodeConflict, conflict.Code)
	require.Equal(t, "idempotency_key_conflict", conflict.Data.Type)
}
