package mcpproxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemmcp"
)

// ordersConfig protects every side-effecting tool of the orders server.
const ordersConfig = `
tools:
  create_order: {}
  slow_order: {}
  naive_slow_order: {}
  gated_order: {}
  stuck_order: {}
  declined: {}
  flaky: {}
  gated_flaky: {}
`

// fixture is one test's files: the idem file, the orders server's ledger
// and the proxy's stderr.
type fixture struct {
	dir, db string
	stderr  lockedBuffer
	// terminate is the client transport's TerminateDuration (zero: the
	// SDK's 5 s).
	terminate time.Duration
	// env is added to the proxy's environment.
	env []string
}

func newFixture(t *testing.T) *fixture {
	dir := t.TempDir()
	return &fixture{dir: dir, db: filepath.Join(dir, "idem.db")}
}

// lockedBuffer is a bytes.Buffer safe for a process's stderr copier and
// the test.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func executable(t *testing.T) string {
	exe, err := os.Executable()
	require.NoError(t, err)
	return exe
}

// ordersServer is the argv of the orders server: this test binary.
func ordersServer(t *testing.T) []string {
	return []string{"env", roleEnv + "=orders", executable(t)}
}

// proxyCmd is the proxy as a process of its own (this test binary), in
// front of server, recording in f.db.
func (f *fixture) proxyCmd(t *testing.T, config string, server []string) *exec.Cmd {
	argv, err := json.Marshal(server)
	require.NoError(t, err)
	cmd := exec.Command(executable(t))
	cmd.Env = append(os.Environ(), roleEnv+"=proxy", "IDEM_TEST_DB="+f.db, "IDEM_TEST_CONFIG="+config,
		"IDEM_TEST_COMMAND="+string(argv), "IDEM_TEST_LEDGER="+f.dir)
	cmd.Env = append(cmd.Env, f.env...)
	cmd.Stderr = &f.stderr
	return cmd
}

// connect starts the proxy in front of server and connects the Go SDK's
// client to it.
func (f *fixture) connect(t *testing.T, config string, server []string) *mcp.ClientSession {
	client := mcp.NewClient(&mcp.Implementation{Name: "idem-test", Version: "1"}, nil)
	cs, err := client.Connect(t.Context(), &mcp.CommandTransport{Command: f.proxyCmd(t, config, server), TerminateDuration: f.terminate}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func (f *fixture) effects() []effect { return readJSONL[effect](filepath.Join(f.dir, "effects.jsonl")) }
func (f *fixture) executions() []execution {
	return readJSONL[execution](filepath.Join(f.dir, "calls.jsonl"))
}

// executionsOf are the executions of tool (started ones: not the lines a
// blocking tool adds when it finishes).
func (f *fixture) executionsOf(tool string) []execution {
	var out []execution
	for _, e := range f.executions() {
		if e.Tool == tool && !e.Finished {
			out = append(out, e)
		}
	}
	return out
}

// answer is a tools/call's result or error.
type answer struct {
	r   *mcp.CallToolResult
	err error
}

// callAsync is callTool in a goroutine of its own: its answer comes on the
// channel.
func callAsync(ctx context.Context, cs *mcp.ClientSession, tool string, args map[string]any, key string) <-chan answer {
	done := make(chan answer, 1)
	go func() {
		r, err := callTool(ctx, cs, tool, args, key)
		done <- answer{r, err}
	}()
	return done
}

func callTool(ctx context.Context, cs *mcp.ClientSession, tool string, args map[string]any, key string) (*mcp.CallToolResult, error) {
	p := &mcp.CallToolParams{Name: tool, Arguments: args}
	if key != "" {
		p.Meta = mcp.Meta{MetaKey: key}
	}
	return cs.CallTool(ctx, p)
}

func textOf(t *testing.T, r *mcp.CallToolResult) string {
	t.Helper()
	require.Len(t, r.Content, 1)
	tc, ok := r.Content[0].(*mcp.TextContent)
	require.True(t, ok, "content %T", r.Content[0])
	return tc.Text
}

func replayed(r *mcp.CallToolResult) bool { return r.Meta[MetaReplayed] == true }

// requireRPCError checks that err is a JSON-RPC error with code and, if typ
// is not empty, data.type typ.
func requireRPCError(t *testing.T, err error, code int64, typ string) {
	t.Helper()
	var we *jsonrpc.Error
	require.ErrorAs(t, err, &we)
	require.Equal(t, code, we.Code, we.Message)
	if typ != "" {
		var data struct {
			Type string `json:"type"`
		}
		require.NoError(t, json.Unmarshal(we.Data, &data))
		require.Equal(t, typ, data.Type)
	}
}

// waitFile waits for path to exist and returns its contents.
func waitFile(t *testing.T, path string) []byte {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		b, err := os.ReadFile(path)
		if err == nil && len(b) > 0 {
			return b
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not appear", path)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestCountedEffectRunsOnceThroughTheProxy(t *testing.T) {
	f := newFixture(t)
	cs := f.connect(t, ordersConfig, ordersServer(t))
	ctx := t.Context()
	args := map[string]any{"sku": "A1", "qty": 2}

	first, err := callTool(ctx, cs, "create_order", args, "order-k1")
	require.NoError(t, err)
	require.Equal(t, "order 1: 2 x A1", textOf(t, first))
	require.False(t, replayed(first))

	second, err := callTool(ctx, cs, "create_order", args, "order-k1")
	require.NoError(t, err)
	require.Equal(t, "order 1: 2 x A1", textOf(t, second))
	require.True(t, replayed(second), "meta %v", second.Meta)
	require.Len(t, f.effects(), 1)
	ex := f.executionsOf("create_order")
	require.Len(t, ex, 1)
	require.Equal(t, execution{Tool: "create_order", Key: "order-k1", Attempt: 1, PID: ex[0].PID}, ex[0],
		"the key, the attempt and the recovered flag reach the server in _meta")

	t.Run("other arguments with the key are refused", func(t *testing.T) {
		_, err := callTool(ctx, cs, "create_order", map[string]any{"sku": "A1", "qty": 3}, "order-k1")
		requireRPCError(t, err, idemmcp.CodeConflict, "idempotency_key_conflict")
		_, err = callTool(ctx, cs, "declined", args, "order-k1")
		requireRPCError(t, err, idemmcp.CodeConflict, "idempotency_key_conflict")
		require.Len(t, f.effects(), 1)
	})
	t.Run("a call without a key is refused", func(t *testing.T) {
		_, err := callTool(ctx, cs, "create_order", args, "")
		requireRPCError(t, err, idemmcp.CodeKeyRequired, "idempotency_key_required")
		require.Len(t, f.effects(), 1)
	})
	t.Run("concurrent calls with one key run once", func(t *testing.T) {
		const n = 4
		texts := make(chan string, n)
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				r, err := callTool(ctx, cs, "create_order", map[string]any{"sku": "B2", "qty": 1}, "order-k2")
				if err != nil {
					t.Error(err)
					texts <- ""
					return
				}
				texts <- r.Content[0].(*mcp.TextContent).Text
			})
		}
		wg.Wait()
		close(texts)
		for s := range texts {
			require.Equal(t, "order 2: 1 x B2", s)
		}
		require.Len(t, f.effects(), 2)
	})
	t.Run("a protocol error is recorded and replayed", func(t *testing.T) {
		for range 2 {
			_, err := callTool(ctx, cs, "declined", args, "declined-k3")
			requireRPCError(t, err, -32001, "")
			require.ErrorContains(t, err, "card declined")
		}
		require.Len(t, f.executionsOf("declined"), 1)
	})
	t.Run("a result the server marks retryable is not recorded", func(t *testing.T) {
		r, err := callTool(ctx, cs, "flaky", args, "flaky-k4")
		require.NoError(t, err)
		require.Equal(t, "try again", textOf(t, r))
		r, err = callTool(ctx, cs, "flaky", args, "flaky-k4")
		require.NoError(t, err)
		require.Equal(t, "flaky ok after 1", textOf(t, r))
		require.False(t, replayed(r))
		r, err = callTool(ctx, cs, "flaky", args, "flaky-k4")
		require.NoError(t, err)
		require.Equal(t, "flaky ok after 1", textOf(t, r))
		require.True(t, replayed(r))
		require.Len(t, f.executionsOf("flaky"), 2)
	})
	t.Run("a schema failure is not recorded", func(t *testing.T) {
		before := len(f.effects())
		bad, err := callTool(ctx, cs, "create_order", map[string]any{"sku": 7}, "order-k5")
		require.NoError(t, err)
		require.True(t, bad.IsError)
		require.Contains(t, textOf(t, bad), `validating "arguments"`)
		require.Len(t, f.effects(), before)
		// The key is free: the corrected call runs, instead of a conflict.
		good, err := callTool(ctx, cs, "create_order", map[string]any{"sku": "Z", "qty": 1}, "order-k5")
		require.NoError(t, err)
		require.False(t, good.IsError)
		require.Len(t, f.effects(), before+1)
	})
	t.Run("a read-only tool is relayed without a warning", func(t *testing.T) {
		_, err := cs.ListTools(ctx, nil)
		require.NoError(t, err)
		r, err := callTool(ctx, cs, "get_order", nil, "")
		require.NoError(t, err)
		require.Equal(t, "3 orders", textOf(t, r))
		require.NotContains(t, f.stderr.String(), `"get_order"`)
	})
}

func TestUnconfiguredToolRunsUnprotectedWithAWarning(t *testing.T) {
	f := newFixture(t)
	cs := f.connect(t, "", ordersServer(t))
	for range 2 {
		r, err := callTool(t.Context(), cs, "create_order", map[string]any{"sku": "A1", "qty": 1}, "order-k1")
		require.NoError(t, err)
		require.False(t, replayed(r))
	}
	require.Len(t, f.effects(), 2, "an unprotected call runs every time")
	require.NoError(t, cs.Close())
	require.Equal(t, 1, strings.Count(f.stderr.String(), `tool "create_order" is not in the configuration: its calls run unprotected`),
		"stderr: %s", f.stderr.String())
}

func TestNaturalKeyFromArguments(t *testing.T) {
	f := newFixture(t)
	cs := f.connect(t, "tools:\n  create_order: {keyArgs: [sku]}\n", ordersServer(t))
	r1, err := callTool(t.Context(), cs, "create_order", map[string]any{"sku": "A1", "qty": 1}, "")
	require.NoError(t, err)
	r2, err := callTool(t.Context(), cs, "create_order", map[string]any{"sku": "A1", "qty": 1}, "ignored")
	require.NoError(t, err)
	require.Equal(t, textOf(t, r1), textOf(t, r2))
	require.True(t, replayed(r2))
	_, err = callTool(t.Context(), cs, "create_order", map[string]any{"sku": "A1", "qty": 2}, "")
	requireRPCError(t, err, idemmcp.CodeConflict, "idempotency_key_conflict")
	ex := f.executionsOf("create_order")
	require.Len(t, ex, 1)
	require.Equal(t, idem.KeyOf("create_order", `"A1"`), ex[0].Key, "the natural key reaches the server in _meta")
}

// TestServerKilledMidCallIsRecovered kills the server while a protected call
// runs: the proxy restarts it and re-executes the call with the key and the
// recovered flag, so a key-aware server reconciles (one effect), and a naive
// one repeats its effect: the at-least-once of a recovered call.
func TestServerKilledMidCallIsRecovered(t *testing.T) {
	for _, tc := range []struct {
		tool    string
		effects int
	}{{"slow_order", 1}, {"naive_slow_order", 2}} {
		t.Run(tc.tool, func(t *testing.T) {
			f := newFixture(t)
			cs := f.connect(t, ordersConfig, ordersServer(t))
			args := map[string]any{"sku": "C3", "qty": 5}
			done := callAsync(t.Context(), cs, tc.tool, args, "slow-k1")
			pid, err := strconv.Atoi(string(waitFile(t, filepath.Join(f.dir, "blocked"))))
			require.NoError(t, err)
			require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
			a := <-done
			require.NoError(t, a.err)
			require.Equal(t, fmt.Sprintf("order %d: 5 x C3", tc.effects), textOf(t, a.r))
			require.False(t, replayed(a.r), "the answer comes from the re-execution")

			ex := f.executionsOf(tc.tool)
			require.Len(t, ex, 2)
			require.Equal(t, execution{Tool: tc.tool, Key: "slow-k1", Attempt: 1, PID: pid}, ex[0])
			require.Equal(t, execution{Tool: tc.tool, Key: "slow-k1", Attempt: 2, Recovered: true, PID: ex[1].PID}, ex[1])
			require.NotEqual(t, pid, ex[1].PID, "a new server process")
			require.Len(t, f.effects(), tc.effects)
			require.Contains(t, f.stderr.String(), "the server process died")

			// The session goes on with the new server; the recovered call is recorded.
			again, err := callTool(t.Context(), cs, tc.tool, args, "slow-k1")
			require.NoError(t, err)
			require.True(t, replayed(again))
			require.Len(t, f.executionsOf(tc.tool), 2)
			r, err := callTool(t.Context(), cs, "create_order", args, "after-restart")
			require.NoError(t, err)
			require.Equal(t, fmt.Sprintf("order %d: 5 x C3", tc.effects+1), textOf(t, r))
		})
	}
}

// TestCancelledProtectedCallIsNotForwarded cancels the client's first call
// while the server runs it, and a retry arrives meanwhile: the server never
// sees a cancellation, the call runs to its end, and the retry gets its
// recorded answer.
func TestCancelledProtectedCallIsNotForwarded(t *testing.T) {
	f := newFixture(t)
	cs := f.connect(t, ordersConfig, ordersServer(t))
	args := map[string]any{"sku": "D4", "qty": 1}
	ctx, cancel := context.WithCancel(t.Context())
	first := f.startGated(t, ctx, cs, args)
	cancel()
	require.ErrorIs(t, <-first, context.Canceled)

	retry := callAsync(t.Context(), cs, "gated_order", args, "gated-k1")
	f.openGate(t)
	a := <-retry
	require.NoError(t, a.err)
	require.Equal(t, "order 1: 1 x D4", textOf(t, a.r))
	require.True(t, replayed(a.r))
	require.Len(t, f.effects(), 1)
	var finished []execution
	for _, e := range f.executions() {
		if e.Finished {
			finished = append(finished, e)
		}
	}
	require.Len(t, finished, 1)
	require.False(t, finished[0].Cancelled, "the server saw a cancellation")
}

// TestServerDyingBeforeInitializationEndsTheProxy: a server that cannot
// start is not restarted in a loop.
func TestServerDyingBeforeInitializationEndsTheProxy(t *testing.T) {
	e, err := idem.OpenFile(filepath.Join(t.TempDir(), "idem.db"), &idem.BoltOptions{NoSync: true}, nil)
	require.NoError(t, err)
	defer e.Close()
	inR, inW := io.Pipe()
	defer inW.Close()
	var stderr lockedBuffer
	p := &Proxy{Engine: e, Command: []string{executable(t)}, Env: append(os.Environ(), roleEnv+"=exit"), Stderr: &stderr}
	err = p.Serve(t.Context(), inR, io.Discard)
	require.ErrorContains(t, err, "the server exited before the session was initialized (exit status 3): not restarting it")

	p.Command = []string{filepath.Join(t.TempDir(), "no-such-server")}
	require.ErrorContains(t, p.Serve(t.Context(), inR, io.Discard), "starting the server")
}

// rawSession is a client speaking JSON-RPC lines to a proxy process.
type rawSession struct {
	t     *testing.T
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan json.RawMessage
}

// startSession is startRaw and the session's handshake: initialize, its
// answer, and notifications/initialized.
func (f *fixture) startSession(t *testing.T, config string, server []string) *rawSession {
	s := f.startRaw(t, config, server)
	s.send(rawInit)
	s.await("1")
	s.send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	return s
}

func (f *fixture) startRaw(t *testing.T, config string, server []string) *rawSession {
	cmd := f.proxyCmd(t, config, server)
	in, err := cmd.StdinPipe()
	require.NoError(t, err)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	s := &rawSession{t: t, cmd: cmd, in: in, lines: make(chan json.RawMessage, 100)}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 1<<24)
		for sc.Scan() {
			s.lines <- json.RawMessage(bytes.Clone(sc.Bytes()))
		}
		close(s.lines)
	}()
	t.Cleanup(func() {
		_ = in.Close()
		_ = cmd.Wait()
	})
	return s
}

func (s *rawSession) send(msg string) {
	_, err := io.WriteString(s.in, msg+"\n")
	require.NoError(s.t, err)
}

// await returns the message answering id, skipping others.
func (s *rawSession) await(id string) map[string]json.RawMessage {
	s.t.Helper()
	for line := range s.lines {
		var m map[string]json.RawMessage
		require.NoError(s.t, json.Unmarshal(line, &m), "%s", line)
		if _, isReq := m["method"]; !isReq && string(m["id"]) == id {
			return m
		}
	}
	s.t.Fatalf("no answer to %s", id)
	return nil
}

const rawInit = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`

// TestReplayAnswersUnderTheNewID checks ids at the wire: the first call and
// its retry are answered under their own ids, whatever their type.
func TestReplayAnswersUnderTheNewID(t *testing.T) {
	f := newFixture(t)
	s := f.startSession(t, ordersConfig, ordersServer(t))
	call := `{"jsonrpc":"2.0","id":%s,"method":"tools/call","params":{"name":"create_order","arguments":%s,"_meta":{"io.github.idemkit/idempotency-key":"k"}}}`
	s.send(fmt.Sprintf(call, "7", `{"sku":"A","qty":1}`))
	first := s.await("7")
	s.send(fmt.Sprintf(call, `"retry/8"`, `{"qty":1.0,"sku":"A"}`))
	second := s.await(`"retry/8"`)
	var r1, r2 map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(first["result"], &r1))
	require.NoError(t, json.Unmarshal(second["result"], &r2))
	require.JSONEq(t, string(r1["content"]), string(r2["content"]))
	require.JSONEq(t, `{"io.github.idemkit/replayed":true}`, string(r2["_meta"]))
	require.Len(t, f.effects(), 1, "1.0 is 1: key order and number forms do not make another request")
}

// TestProxyKilledTakesItsServer: SIGKILL of the proxy kills the server
// (Pdeathsig), and a new proxy on the same file recovers the interrupted
// call with the recovered flag.
func TestProxyKilledTakesItsServer(t *testing.T) {
	f := newFixture(t)
	s := f.startSession(t, ordersConfig, ordersServer(t))
	s.send(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"slow_order","arguments":{"sku":"E5","qty":1},"_meta":{"io.github.idemkit/idempotency-key":"k"}}}`)
	pid, err := strconv.Atoi(string(waitFile(t, filepath.Join(f.dir, "blocked"))))
	require.NoError(t, err)
	require.NoError(t, s.cmd.Process.Kill())
	_ = s.cmd.Wait()
	deadline := time.Now().Add(30 * time.Second)
	for processAlive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("server %d outlived its proxy", pid)
		}
		time.Sleep(5 * time.Millisecond)
	}

	cs := f.connect(t, ordersConfig, ordersServer(t))
	r, err := callTool(t.Context(), cs, "slow_order", map[string]any{"sku": "E5", "qty": 1}, "k")
	require.NoError(t, err)
	require.Equal(t, "order 1: 1 x E5", textOf(t, r))
	ex := f.executionsOf("slow_order")
	require.Len(t, ex, 2)
	require.True(t, ex[1].Recovered)
	require.Equal(t, 2, ex[1].Attempt)
	require.Len(t, f.effects(), 1)
}

// processAlive reports whether pid runs (a zombie, dead but not reaped by a
// container's init, counts as dead).
func processAlive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if errors.Is(err, os.ErrNotExist) {
		return false
	}
	if err != nil {
		return syscall.Kill(pid, 0) == nil
	}
	// The state follows the command's closing parenthesis.
	i := bytes.LastIndexByte(stat, ')')
	return !(i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z')
}

// killBlocked waits for the orders server to block mid-call and SIGKILLs it.
// startGated starts a call of gated_order with args and the key gated-k1
// (ctx its context) and waits until the server blocks in it: the call's
// error comes on the channel once it ends (openGate).
func (f *fixture) startGated(t *testing.T, ctx context.Context, cs *mcp.ClientSession, args map[string]any) <-chan error {
	t.Helper()
	first := make(chan error, 1)
	go func() {
		_, err := callTool(ctx, cs, "gated_order", args, "gated-k1")
		first <- err
	}()
	waitFile(t, filepath.Join(f.dir, "blocked"))
	return first
}

// gatedDuplicate runs the proxy with env, starts a gated call of sku and
// sends a duplicate while the server blocks in it, which is refused as in
// progress: it returns the fixture, the session, the call's arguments, the
// first call's end (startGated) and the duplicate's error.
func gatedDuplicate(t *testing.T, env, sku string) (*fixture, *mcp.ClientSession, map[string]any, <-chan error, error) {
	f := newFixture(t)
	f.env = []string{env}
	cs := f.connect(t, ordersConfig, ordersServer(t))
	args := map[string]any{"sku": sku, "qty": 1}
	first := f.startGated(t, t.Context(), cs, args)
	_, err := callTool(t.Context(), cs, "gated_order", args, "gated-k1")
	requireRPCError(t, err, idemmcp.CodeInProgress, "idempotency_key_in_progress")
	return f, cs, args, first, err
}

// openGate lets the server's gated calls end.
func (f *fixture) openGate(t *testing.T) {
	t.Helper()
	require.NoError(t, os.WriteFile(filepath.Join(f.dir, "gate"), nil, 0o600))
}

func (f *fixture) killBlocked(t *testing.T) int {
	t.Helper()
	path := filepath.Join(f.dir, "blocked")
	pid, err := strconv.Atoi(string(waitFile(t, path)))
	require.NoError(t, err)
	require.NoError(t, os.Remove(path))
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	return pid
}

// TestServerDyingOnEveryAttempt: after MaxRounds deaths in one call the
// client gets CodeServerDied, and the record stays interrupted: the next call
// with the key re-executes it, recovered.
func TestServerDyingOnEveryAttempt(t *testing.T) {
	f := newFixture(t)
	f.terminate = 200 * time.Millisecond
	cs := f.connect(t, ordersConfig, ordersServer(t))
	done := callAsync(t.Context(), cs, "stuck_order", map[string]any{"sku": "F6", "qty": 1}, "stuck-k1")
	for range MaxRounds {
		f.killBlocked(t)
	}
	err := (<-done).err
	requireRPCError(t, err, CodeServerDied, TypeServerDied)
	require.ErrorContains(t, err, "died during the call 3 times")
	ex := f.executionsOf("stuck_order")
	require.Len(t, ex, MaxRounds)
	for i, e := range ex {
		require.Equal(t, i+1, e.Attempt)
		require.Equal(t, i > 0, e.Recovered)
	}

	ctx, cancel := context.WithCancel(t.Context())
	done = callAsync(ctx, cs, "stuck_order", map[string]any{"sku": "F6", "qty": 1}, "stuck-k1")
	waitFile(t, filepath.Join(f.dir, "blocked"))
	ex = f.executionsOf("stuck_order")
	require.Len(t, ex, MaxRounds+1)
	require.Equal(t, execution{Tool: "stuck_order", Key: "stuck-k1", Attempt: MaxRounds + 1, Recovered: true, PID: ex[MaxRounds].PID}, ex[MaxRounds])
	// The Go SDK's Close waits for the calls in flight, and the proxy's
	// end for the protected calls it runs: give up the call, and let
	// the client's SIGTERM end the proxy.
	cancel()
	require.ErrorIs(t, (<-done).err, context.Canceled)
}

// TestInFlightFailRefusesADuplicate: under InFlightFail a duplicate of a
// running call gets idemmcp.CodeInProgress with retryAfter.
func TestInFlightFailRefusesADuplicate(t *testing.T) {
	f, _, _, first, err := gatedDuplicate(t, "IDEM_TEST_INFLIGHT=fail", "G7")
	var we *jsonrpc.Error
	require.ErrorAs(t, err, &we)
	require.JSONEq(t, `{"type":"idempotency_key_in_progress","retryAfter":1}`, string(we.Data))
	f.openGate(t)
	require.NoError(t, <-first)
	require.Len(t, f.effects(), 1)
}

// TestRecoverRefuseAnswersIncomplete: under RecoverRefuse, the call the
// server died in is not re-executed: the client gets idemmcp.CodeIncomplete, and so
// does a retry, until an operator resolves the key.
func TestRecoverRefuseAnswersIncomplete(t *testing.T) {
	f := newFixture(t)
	f.env = []string{"IDEM_TEST_RECOVERY=refuse"}
	cs := f.connect(t, ordersConfig, ordersServer(t))
	args := map[string]any{"sku": "H8", "qty": 1}
	done := callAsync(t.Context(), cs, "slow_order", args, "slow-k1")
	f.killBlocked(t)
	requireRPCError(t, (<-done).err, idemmcp.CodeIncomplete, "idempotency_key_incomplete")
	_, err := callTool(t.Context(), cs, "slow_order", args, "slow-k1")
	requireRPCError(t, err, idemmcp.CodeIncomplete, "idempotency_key_incomplete")
	require.Len(t, f.executionsOf("slow_order"), 1)
}

// TestDuplicateWaitsAtMostMaxWait: a duplicate of a call that runs longer
// than MaxWait is refused as in progress; the first call is recorded when it
// ends, and the next retry replays it.
func TestDuplicateWaitsAtMostMaxWait(t *testing.T) {
	f, cs, args, first, err := gatedDuplicate(t, "IDEM_TEST_MAXWAIT=50ms", "J9")
	f.openGate(t)
	require.NoError(t, <-first, "the first call outlives MaxWait")
	r, err := callTool(t.Context(), cs, "gated_order", args, "gated-k1")
	require.NoError(t, err)
	require.True(t, replayed(r))
	require.Len(t, f.effects(), 1)
}

// TestContinuationHasItsOwnKey: a call carrying requestState (a round of a
// multi-round-trip call) is recorded under a key of its own, as in idemmcp,
// so it neither conflicts with nor replays the first round.
func TestContinuationHasItsOwnKey(t *testing.T) {
	f := newFixture(t)
	s := f.startSession(t, ordersConfig, ordersServer(t))
	call := `{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"create_order","arguments":{"sku":"K","qty":1},%s"_meta":{"io.github.idemkit/idempotency-key":"k"}}}`
	texts := map[int]string{}
	for i, state := range []string{``, `"requestState":"round-2",`, `"requestState":"round-2",`, ``} {
		id := 10 + i
		s.send(fmt.Sprintf(call, id, state))
		m := s.await(strconv.Itoa(id))
		require.Contains(t, m, "result", "%v", m)
		texts[id] = string(m["result"])
	}
	require.Len(t, f.effects(), 2, "the first round and the continuation each ran once")
	require.Contains(t, texts[10], "order 1")
	require.Contains(t, texts[11], "order 2")
	require.Contains(t, texts[12], "order 2")
	require.Contains(t, texts[12], MetaReplayed)
	require.Contains(t, texts[13], "order 1")
	require.Contains(t, texts[13], MetaReplayed)
}

// TestClientGoneMidCall: the client closes the session (both pipes) while a
// protected call runs and the server still writes to it: the call runs to
// its end and is recorded, so the next session replays it.
func TestClientGoneMidCall(t *testing.T) {
	f := newFixture(t)
	cmd := f.proxyCmd(t, ordersConfig, ordersServer(t))
	in, err := cmd.StdinPipe()
	require.NoError(t, err)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	lines := bufio.NewScanner(out)
	for _, msg := range []string{rawInit, `{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"gated_order","arguments":{"sku":"L","qty":1},"_meta":{"io.github.idemkit/idempotency-key":"gone-k1","progressToken":"p"}}}`} {
		_, err := io.WriteString(in, msg+"\n")
		require.NoError(t, err)
	}
	require.True(t, lines.Scan(), "the answer to initialize")
	waitFile(t, filepath.Join(f.dir, "blocked"))
	require.NoError(t, out.Close())
	require.NoError(t, in.Close())
	f.openGate(t)
	err = cmd.Wait()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "the proxy reports the failed write")
	require.Contains(t, f.stderr.String(), "writing to the client failed")

	cs := f.connect(t, ordersConfig, ordersServer(t))
	r, err := callTool(t.Context(), cs, "gated_order", map[string]any{"sku": "L", "qty": 1}, "gone-k1")
	require.NoError(t, err)
	require.True(t, replayed(r), "the call was recorded after its client left")
	require.Equal(t, "order 1: 1 x L", textOf(t, r))
	require.Len(t, f.executionsOf("gated_order"), 1)
}

// TestKeyRulesHoldForContinuations: a continuation's stored key is a hash of
// the client's key, which must still meet the engine's key rules: a key
// with white space at an end or a format character is refused as invalid
// for the first round and for a continuation alike, and nothing runs.
func TestKeyRulesHoldForContinuations(t *testing.T) {
	f := newFixture(t)
	s := f.startSession(t, ordersConfig, ordersServer(t))
	call := `{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"create_order","arguments":{"sku":"K","qty":1},%s"_meta":{"io.github.idemkit/idempotency-key":%q}}}`
	id := 10
	for _, key := range []string{" k", "k\u00a0", "\ufeffk"} {
		for _, state := range []string{``, `"requestState":"round-2",`} {
			id++
			s.send(fmt.Sprintf(call, id, state, key))
			m := s.await(strconv.Itoa(id))
			require.Contains(t, m, "error", "key %q %s: %v", key, state, m)
			require.Contains(t, string(m["error"]), idemmcp.TypeKeyInvalid, "key %q %s", key, state)
			var we struct{ Message string }
			require.NoError(t, json.Unmarshal(m["error"], &we))
			require.Regexp(t, `^idempotency: invalid idempotency key: `, we.Message, "one prefix, no error chain of the engine's")
			require.NotContains(t, we.Message, "idem: ")
		}
	}
	require.Empty(t, f.effects())
}

// TestBatchOfProtectedCallsIsRefused: a JSON-RPC batch (an array, which
// clients of the 2025-03-26 protocol may send) holding a tools/call of a
// protected tool is refused, each of its requests with an error, and none
// reaches the server: relayed as it is, its calls would run unprotected, the
// same key twice included.
func TestBatchOfProtectedCallsIsRefused(t *testing.T) {
	f := newFixture(t)
	s := f.startRaw(t, ordersConfig, ordersServer(t))
	s.send(strings.Replace(rawInit, "2025-11-25", "2025-03-26", 1))
	s.await("1")
	s.send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	call := `{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"create_order","arguments":{"sku":"B","qty":1},"_meta":{"io.github.idemkit/idempotency-key":"batch-k"}}}`
	s.send("[" + fmt.Sprintf(call, 10) + "," + fmt.Sprintf(call, 11) + `,{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}}]`)
	var answers []map[string]json.RawMessage
	select {
	case line := <-s.lines:
		require.NoError(t, json.Unmarshal(line, &answers), "%s", line)
	case <-time.After(30 * time.Second):
		t.Fatal("no answer to the batch")
	}
	require.Len(t, answers, 2, "one answer per request of the batch")
	ids := map[string]bool{}
	for _, a := range answers {
		ids[string(a["id"])] = true
		require.Contains(t, string(a["error"]), fmt.Sprint(jsonrpc.CodeInvalidRequest), "%v", a)
	}
	require.Equal(t, map[string]bool{"10": true, "11": true}, ids)
	// The session goes on, and the key is free.
	s.send(fmt.Sprintf(call, 12))
	m := s.await("12")
	require.Contains(t, m, "result", "%v", m)
	require.Len(t, f.effects(), 1)
}

// TestProtectedCallWithoutIDDoesNotReachTheServer: a tools/call of a
// protected tool with a null id, or none (a notification), cannot be
// answered under its own id nor recorded as a call: it is refused (an
// invalid-request error with a null id, as JSON-RPC answers a request whose
// id it cannot tell) or dropped with a warning, never relayed to run
// unprotected.
func TestProtectedCallWithoutIDDoesNotReachTheServer(t *testing.T) {
	f := newFixture(t)
	s := f.startSession(t, ordersConfig, ordersServer(t))
	params := `"method":"tools/call","params":{"name":"create_order","arguments":{"sku":"N","qty":1},"_meta":{"io.github.idemkit/idempotency-key":"null-k"}}`
	s.send(`{"jsonrpc":"2.0",` + params + `}`)
	s.send(`{"jsonrpc":"2.0","id":null,` + params + `}`)
	var m map[string]json.RawMessage
	select {
	case line := <-s.lines:
		require.NoError(t, json.Unmarshal(line, &m), "%s", line)
	case <-time.After(30 * time.Second):
		t.Fatal("no answer to the call with a null id")
	}
	require.Equal(t, "null", string(m["id"]))
	require.Contains(t, string(m["error"]), fmt.Sprint(jsonrpc.CodeInvalidRequest), "%v", m)
	// The session goes on; the server ran nothing of the two.
	s.send(`{"jsonrpc":"2.0","id":5,` + params + `}`)
	m = s.await("5")
	require.Contains(t, m, "result", "%v", m)
	require.Len(t, f.effects(), 1)
	require.Contains(t, f.stderr.String(), "without an id")
}

// TestAnswerOverTheEngineLimit: a server's answer over the engine's
// MaxResponseSize cannot be recorded (the key is done with
// idem.ErrResponseTooLarge). The caller whose call ran still gets the
// server's answer: the effect happened, and "the store failed, retry" would
// be false. A retry with the key gets an internal error, not a refusal with
// retryAfter, and the server does not run it again.
func TestAnswerOverTheEngineLimit(t *testing.T) {
	f := newFixture(t)
	f.env = []string{"IDEM_TEST_MAXRESPONSE=1024"}
	s := f.startSession(t, ordersConfig, ordersServer(t))
	sku := strings.Repeat("s", 4<<10)
	call := `{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"create_order","arguments":{"sku":%q,"qty":1},"_meta":{"io.github.idemkit/idempotency-key":"big-k"}}}`
	s.send(fmt.Sprintf(call, 10, sku))
	m := s.await("10")
	require.Contains(t, m, "result", "the caller whose call ran gets the answer")
	require.Contains(t, string(m["result"]), sku)
	s.send(fmt.Sprintf(call, 11, sku))
	m = s.await("11")
	require.Contains(t, string(m["error"]), fmt.Sprint(jsonrpc.CodeInternalError), "%s", m["error"])
	require.NotContains(t, string(m["error"]), "retryAfter")
	require.Len(t, f.effects(), 1)
}

// TestStoreFailureAfterTheServerRanAnswersItsResult: when the server ran a
// call but the store fails to record its outcome (the done commit does not
// fit in the file's MaxSize: ErrFileFull), the effect is done, so the caller
// gets the server's answer, not a refusal saying the tool did not run; the
// store's error goes to stderr.
func TestStoreFailureAfterTheServerRanAnswersItsResult(t *testing.T) {
	f := newFixture(t)
	f.env = []string{"IDEM_TEST_MAXRESPONSE=8388608", "IDEM_TEST_MAXSIZE=1048576"}
	s := f.startSession(t, ordersConfig, ordersServer(t))
	sku := strings.Repeat("s", 2<<20)
	call := `{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"create_order","arguments":{"sku":%q,"qty":1},"_meta":{"io.github.idemkit/idempotency-key":"full-k"}}}`
	s.send(fmt.Sprintf(call, 10, sku))
	m := s.await("10")
	require.Contains(t, m, "result", "the caller whose call ran gets the answer: %.300s", m["error"])
	require.Contains(t, string(m["result"]), sku)
	require.Len(t, f.executionsOf("create_order"), 1)
}

// TestWaiterOfAnUnrecordedAnswerRunsItsOwn: a call that waits for a call
// with its key whose answer the server marked retryable (not recorded) gets
// no copy of that answer: the key is free, and it runs on its own. The
// waiter is started once the first call blocks in the server; the pause
// before the gate opens makes it likely to wait, and the answers are the
// same if it came later (it then runs after the first call, as a new one).
func TestWaiterOfAnUnrecordedAnswerRunsItsOwn(t *testing.T) {
	f := newFixture(t)
	cs := f.connect(t, ordersConfig, ordersServer(t))
	args := map[string]any{"sku": "F1", "qty": 1}
	first := callAsync(t.Context(), cs, "gated_flaky", args, "flaky-w1")
	waitFile(t, filepath.Join(f.dir, "blocked-flaky"))
	waiter := callAsync(t.Context(), cs, "gated_flaky", args, "flaky-w1")
	time.Sleep(200 * time.Millisecond) // not a timing claim: see above
	require.NoError(t, os.WriteFile(filepath.Join(f.dir, "gate-flaky"), []byte("open"), 0o600))
	a := <-first
	require.NoError(t, a.err)
	require.Equal(t, "try again", textOf(t, a.r), "the first call gets its own answer, not recorded")
	w := <-waiter
	require.NoError(t, w.err)
	require.Equal(t, "gated_flaky ok after 1", textOf(t, w.r), "the waiter ran on its own")
	require.False(t, replayed(w.r))
	require.Len(t, f.executionsOf("gated_flaky"), 2)
}

// TestUnlistedToolIsReported: a configured tool that the server's tools/list
// does not list is reported on stderr once the last page has arrived (the
// orders server lists its tools two a page), and only that one: a tool on a
// later page is no mistake. A second listing reports nothing new.
func TestUnlistedToolIsReported(t *testing.T) {
	f := newFixture(t)
	f.env = []string{"IDEM_TEST_PAGESIZE=2"}
	cs := f.connect(t, "tools:\n  create_order: {}\n  get_order: {readOnly: true}\n  crate_order: {}\n", ordersServer(t))
	const report = `tool "crate_order" is in the configuration, but the server does not list it`
	first, err := cs.ListTools(t.Context(), nil)
	require.NoError(t, err)
	require.NotEmpty(t, first.NextCursor, "the list has more than one page")
	var names []string
	for range 2 {
		names = names[:0]
		for tool, err := range cs.Tools(t.Context(), nil) {
			require.NoError(t, err)
			names = append(names, tool.Name)
		}
	}
	require.Contains(t, names, "get_order")
	require.NotContains(t, names, "crate_order")
	require.NoError(t, cs.Close())
	require.Equal(t, 1, strings.Count(f.stderr.String(), report), "stderr: %s", f.stderr.String())
	require.NotContains(t, f.stderr.String(), `"create_order" is in the configuration`)
	require.NotContains(t, f.stderr.String(), `"get_order" is in the configuration`)
}
