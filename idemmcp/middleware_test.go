package idemmcp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemmcp"
)

// rig is a real go-sdk server behind the middleware and a real go-sdk
// client, connected in memory, over an engine on a file.
type rig struct {
	t      *testing.T
	path   string
	e      *idem.Engine
	m      *idemmcp.Middleware
	server *mcp.Server
	cs     *mcp.ClientSession
}

// newRig opens an engine on path (a new file if empty), builds the server
// with add, and connects a client.
func newRig(t *testing.T, path string, opts *idemmcp.Options, copts *mcp.ClientOptions, add func(r *rig)) *rig {
	t.Helper()
	if path == "" {
		path = filepath.Join(t.TempDir(), "idem.db")
	}
	e, err := idem.Open(path, &idem.Options{PruneInterval: -1})
	require.NoError(t, err)
	r := &rig{t: t, path: path, e: e, m: idemmcp.New(e, opts)}
	r.server = mcp.NewServer(&mcp.Implementation{Name: "shop", Version: "v1"}, nil)
	add(r)
	r.server.AddReceivingMiddleware(r.m.Wrap)
	st, ct := mcp.NewInMemoryTransports()
	ss, err := r.server.Connect(t.Context(), st, nil)
	require.NoError(t, err)
	client := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, copts)
	client.AddSendingMiddleware(idemmcp.ClientMiddleware(nil))
	r.cs, err = client.Connect(t.Context(), ct, nil)
	require.NoError(t, err)
	t.Cleanup(func() { r.close() })
	_ = ss
	return r
}

// close closes the client and the engine (idempotent).
func (r *rig) close() {
	if r.cs != nil {
		r.cs.Close()
		r.cs = nil
	}
	if r.e != nil {
		require.NoError(r.t, r.e.Close())
		r.e = nil
	}
}

func (r *rig) call(key, tool string, args any) (*mcp.CallToolResult, error) {
	ctx := r.t.Context()
	if key != "" {
		ctx = idemmcp.WithKey(ctx, key)
	}
	return r.cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
}

// requireReplay calls tool with key and args and requires the stored
// outcome back, replayed.
func (r *rig) requireReplay(t *testing.T, key, tool string, args any) *mcp.CallToolResult {
	t.Helper()
	res, err := r.call(key, tool, args)
	require.NoError(t, err)
	require.True(t, idemmcp.Replayed(res))
	return res
}

// requireRPCCode requires err to be a JSON-RPC error with code, and returns
// it.
func requireRPCCode(t *testing.T, err error, code int64) *jsonrpc.Error {
	t.Helper()
	var we *jsonrpc.Error
	require.ErrorAs(t, err, &we)
	require.EqualValues(t, code, we.Code)
	return we
}

func text(t *testing.T, res *mcp.CallToolResult) string {
	t.Helper()
	require.NotNil(t, res)
	require.Len(t, res.Content, 1)
	tc, ok := res.Content[0].(*mcp.TextContent)
	require.True(t, ok, "content is %T", res.Content[0])
	return tc.Text
}

type order struct {
	SKU string `json:"sku" jsonschema:"the product"`
	Qty int    `json:"qty" jsonschema:"how many"`
}

type created struct {
	OrderID string `json:"order_id"`
	Qty     int    `json:"qty"`
}

// createOrder is a tool with a counted side effect.
func createOrder(orders *atomic.Int32) mcp.ToolHandlerFor[order, created] {
	return func(ctx context.Context, _ *mcp.CallToolRequest, in order) (*mcp.CallToolResult, created, error) {
		n := orders.Add(1)
		return nil, created{OrderID: fmt.Sprintf("ord_%d", n), Qty: in.Qty}, nil
	}
}

func shop(orders *atomic.Int32) func(r *rig) {
	return func(r *rig) {
		idemmcp.AddTool(r.server, r.m, &mcp.Tool{Name: "create_order"}, createOrder(orders), nil)
	}
}

func TestOneKeyRunsOnceAndReplays(t *testing.T) {
	var orders atomic.Int32
	r := newRig(t, "", nil, nil, shop(&orders))
	first, err := r.call("k-1", "create_order", map[string]any{"sku": "A1", "qty": 2})
	require.NoError(t, err)
	second, err := r.call("k-1", "create_order", map[string]any{"qty": 2.0, "sku": "A1"}) // other order, 2 as 2.0
	require.NoError(t, err)
	require.EqualValues(t, 1, orders.Load(), "one order for one key")
	require.False(t, idemmcp.Replayed(first))
	require.True(t, idemmcp.Replayed(second))
	require.Equal(t, text(t, first), text(t, second))
	require.JSONEq(t, `{"order_id":"ord_1","qty":2}`, text(t, second))
	sc, err := json.Marshal(second.StructuredContent)
	require.NoError(t, err)
	require.JSONEq(t, `{"order_id":"ord_1","qty":2}`, string(sc))

	other, err := r.call("k-2", "create_order", map[string]any{"sku": "A1", "qty": 2})
	require.NoError(t, err)
	require.False(t, idemmcp.Replayed(other))
	require.EqualValues(t, 2, orders.Load(), "another key is another intent")
}

func TestSameKeyOtherArgumentsIsRefused(t *testing.T) {
	var orders atomic.Int32
	r := newRig(t, "", nil, nil, func(r *rig) {
		shop(&orders)(r)
		idemmcp.AddTool(r.server, r.m, &mcp.Tool{Name: "create_quote"}, createOrder(&orders), nil)
	})
	_, err := r.call("k-1", "create_order", map[string]any{"sku": "A1", "qty": 2})
	require.NoError(t, err)
	for name, call := range map[string]func() (*mcp.CallToolResult, error){
		"other arguments": func() (*mcp.CallToolResult, error) {
			return r.call("k-1", "create_order", map[string]any{"sku": "A1", "qty": 3})
		},
		"other tool": func() (*mcp.CallToolResult, error) {
			return r.call("k-1", "create_quote", map[string]any{"sku": "A1", "qty": 2})
		},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := call()
			ref, ok := idemmcp.RefusalOf(err)
			require.True(t, ok, "a refusal, not %v", err)
			require.Equal(t, idemmcp.TypeConflict, ref.Type)
			require.EqualValues(t, idemmcp.CodeConflict, ref.Code)
		})
	}
	require.EqualValues(t, 1, orders.Load())
	again, err := r.call("k-1", "create_order", map[string]any{"sku": "A1", "qty": 2})
	require.NoError(t, err)
	require.True(t, idemmcp.Replayed(again), "the stored outcome is untouched")
}

// blocking is a create_order that waits for release after it started.
func blocking(orders *atomic.Int32, started chan<- struct{}, release <-chan struct{}) func(r *rig) {
	return func(r *rig) {
		idemmcp.AddTool(r.server, r.m, &mcp.Tool{Name: "create_order"},
			func(ctx context.Context, req *mcp.CallToolRequest, in order) (*mcp.CallToolResult, created, error) {
				started <- struct{}{}
				<-release
				return createOrder(orders)(ctx, req, in)
			}, nil)
	}
}

// waitingRig is a rig whose create_order blocks (blocking, with started and
// release) and whose duplicates send on waiting as they start to wait.
func waitingRig(t *testing.T, orders *atomic.Int32) (r *rig, started, release, waiting chan struct{}) {
	started, release = make(chan struct{}, 2), make(chan struct{})
	waiting = make(chan struct{}, 1)
	idemmcp.SetWaitHook(func() { waiting <- struct{}{} })
	t.Cleanup(func() { idemmcp.SetWaitHook(nil) })
	return newRig(t, "", nil, nil, blocking(orders, started, release)), started, release, waiting
}

func TestConcurrentCallsRunOnce(t *testing.T) {
	var orders atomic.Int32
	r, started, release, waiting := waitingRig(t, &orders)
	args := map[string]any{"sku": "A1", "qty": 2}
	var wg sync.WaitGroup
	results := make([]*mcp.CallToolResult, 2)
	errs := make([]error, 2)
	wg.Go(func() { results[0], errs[0] = r.call("k-1", "create_order", args) })
	<-started
	wg.Go(func() { results[1], errs[1] = r.call("k-1", "create_order", args) })
	<-waiting // the duplicate waits for the first
	close(release)
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	require.EqualValues(t, 1, orders.Load())
	require.Equal(t, text(t, results[0]), text(t, results[1]))
	require.False(t, idemmcp.Replayed(results[0]))
	require.True(t, idemmcp.Replayed(results[1]))
}

func TestInProgressRefusedOrWaitBounded(t *testing.T) {
	for name, opts := range map[string]*idemmcp.Options{
		"refuse":       {InProgress: idemmcp.InProgressRefuse, RetryAfter: 1500 * time.Millisecond},
		"wait bounded": {MaxWait: time.Millisecond, RetryAfter: 1500 * time.Millisecond},
	} {
		t.Run(name, func(t *testing.T) {
			var orders atomic.Int32
			started, release := make(chan struct{}, 2), make(chan struct{})
			r := newRig(t, "", opts, nil, blocking(&orders, started, release))
			args := map[string]any{"sku": "A1", "qty": 2}
			done := make(chan error, 1)
			go func() { _, err := r.call("k-1", "create_order", args); done <- err }()
			<-started
			_, err := r.call("k-1", "create_order", args)
			ref, ok := idemmcp.RefusalOf(err)
			require.True(t, ok, "a refusal, not %v", err)
			require.Equal(t, idemmcp.TypeInProgress, ref.Type)
			require.EqualValues(t, idemmcp.CodeInProgress, ref.Code)
			require.Equal(t, 2, ref.RetryAfter, "seconds, rounded up")
			close(release)
			require.NoError(t, <-done)
			require.EqualValues(t, 1, orders.Load())
		})
	}
}

func TestPanickingToolIsAnInterruptedExecution(t *testing.T) {
	var runs atomic.Int32
	var recovered atomic.Bool
	r := newRig(t, "", nil, nil, func(r *rig) {
		idemmcp.AddTool(r.server, r.m, &mcp.Tool{Name: "create_order"},
			func(ctx context.Context, _ *mcp.CallToolRequest, in order) (*mcp.CallToolResult, created, error) {
				if runs.Add(1) == 1 {
					panic("boom")
				}
				c, _ := idem.CallFrom(ctx)
				recovered.Store(c.Recovered)
				return nil, created{OrderID: "ord_1", Qty: in.Qty}, nil
			}, nil)
	})
	args := map[string]any{"sku": "A1", "qty": 2}
	_, err := r.call("k-1", "create_order", args)
	we := requireRPCCode(t, err, jsonrpc.CodeInternalError)
	require.Contains(t, we.Message, "panicked")

	// The server still serves, and the retry recovers the interrupted
	// execution: the effect may have happened, and the tool is told so.
	res, err := r.call("k-1", "create_order", args)
	require.NoError(t, err)
	require.False(t, idemmcp.Replayed(res))
	require.True(t, recovered.Load())
	r.requireReplay(t, "k-1", "create_order", args)
	require.EqualValues(t, 2, runs.Load())
}

func TestToolErrorsAreStoredAndReplayed(t *testing.T) {
	var runs atomic.Int32
	r := newRig(t, "", nil, nil, func(r *rig) {
		idemmcp.AddTool(r.server, r.m, &mcp.Tool{Name: "typed_fails"},
			func(context.Context, *mcp.CallToolRequest, order) (*mcp.CallToolResult, created, error) {
				runs.Add(1)
				return nil, created{}, errors.New("card declined")
			}, nil)
		idemmcp.AddRawTool(r.server, r.m, &mcp.Tool{Name: "raw_fails", InputSchema: json.RawMessage(`{"type":"object"}`)},
			func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				runs.Add(1)
				return nil, &jsonrpc.Error{Code: -32001, Message: "gateway refused", Data: json.RawMessage(`{"reason":"limit"}`)}
			}, nil)
		idemmcp.AddRawTool(r.server, r.m, &mcp.Tool{Name: "raw_plain_error", InputSchema: json.RawMessage(`{"type":"object"}`)},
			func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				runs.Add(1)
				return nil, errors.New("disk full")
			}, nil)
	})
	args := map[string]any{"sku": "A1", "qty": 2}

	t.Run("IsError result", func(t *testing.T) {
		runs.Store(0)
		first, err := r.call("k-typed", "typed_fails", args)
		require.NoError(t, err)
		require.True(t, first.IsError)
		second, err := r.call("k-typed", "typed_fails", args)
		require.NoError(t, err)
		require.True(t, second.IsError)
		require.True(t, idemmcp.Replayed(second))
		require.Equal(t, "card declined", text(t, second))
		require.EqualValues(t, 1, runs.Load())
	})
	t.Run("protocol error", func(t *testing.T) {
		runs.Store(0)
		_, err1 := r.call("k-raw", "raw_fails", args)
		_, err2 := r.call("k-raw", "raw_fails", args)
		for _, err := range []error{err1, err2} {
			we := requireRPCCode(t, err, -32001)
			require.Equal(t, "gateway refused", we.Message)
			require.JSONEq(t, `{"reason":"limit"}`, string(we.Data))
		}
		require.EqualValues(t, 1, runs.Load())
	})
	t.Run("plain error of a raw handler", func(t *testing.T) {
		runs.Store(0)
		_, err1 := r.call("k-plain", "raw_plain_error", args)
		_, err2 := r.call("k-plain", "raw_plain_error", args)
		require.ErrorContains(t, err1, "disk full")
		require.Equal(t, err1.Error(), err2.Error())
		require.EqualValues(t, 1, runs.Load())
	})
}

func TestSchemaFailuresAreNotStored(t *testing.T) {
	var orders atomic.Int32
	r := newRig(t, "", &idemmcp.Options{Tools: map[string]idemmcp.Policy{"direct_order": {}}}, nil, func(r *rig) {
		shop(&orders)(r)
		// Registered with the SDK directly: the middleware knows it from
		// Options.Tools only.
		mcp.AddTool(r.server, &mcp.Tool{Name: "direct_order"}, createOrder(&orders))
	})
	for _, tool := range []string{"create_order", "direct_order"} {
		t.Run(tool, func(t *testing.T) {
			key := "k-" + tool
			bad, err := r.call(key, tool, map[string]any{"sku": "A1", "qty": "two"})
			require.NoError(t, err)
			require.True(t, bad.IsError, "the SDK refuses the input")
			require.Contains(t, text(t, bad), "validating")
			before := orders.Load()
			// The same key with correct arguments: nothing was stored, so
			// no conflict, and the tool runs.
			good, err := r.call(key, tool, map[string]any{"sku": "A1", "qty": 2})
			require.NoError(t, err)
			require.False(t, good.IsError)
			require.False(t, idemmcp.Replayed(good))
			require.Equal(t, before+1, orders.Load())
		})
	}
}

func TestRetryableIsNotStored(t *testing.T) {
	var runs atomic.Int32
	r := newRig(t, "", nil, nil, func(r *rig) {
		idemmcp.AddTool(r.server, r.m, &mcp.Tool{Name: "typed"},
			func(context.Context, *mcp.CallToolRequest, order) (*mcp.CallToolResult, created, error) {
				if runs.Add(1) == 1 {
					return nil, created{}, idem.Retryable(errors.New("gateway timeout, not charged"))
				}
				return nil, created{OrderID: "ord_1"}, nil
			}, nil)
		idemmcp.AddRawTool(r.server, r.m, &mcp.Tool{Name: "raw", InputSchema: json.RawMessage(`{"type":"object"}`)},
			func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				if runs.Add(1) == 1 {
					return nil, idem.Retryable(errors.New("busy"))
				}
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}, nil
			}, nil)
	})
	for _, tool := range []string{"typed", "raw"} {
		t.Run(tool, func(t *testing.T) {
			runs.Store(0)
			first, err := r.call("k-"+tool, tool, map[string]any{"sku": "A1", "qty": 1})
			if err == nil {
				require.True(t, first.IsError, "the transient failure reaches the client")
			}
			second, err := r.call("k-"+tool, tool, map[string]any{"sku": "A1", "qty": 1})
			require.NoError(t, err)
			require.False(t, second.IsError)
			require.False(t, idemmcp.Replayed(second), "the key was free: the tool ran again")
			r.requireReplay(t, "k-"+tool, tool, map[string]any{"sku": "A1", "qty": 1})
			require.EqualValues(t, 2, runs.Load())
		})
	}
}

func TestContinuationsAreDedupedUnderTheirOwnKey(t *testing.T) {
	var rounds, effects atomic.Int32
	answer := atomic.Value{}
	answer.Store("yes")
	copts := &mcp.ClientOptions{ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"confirm": answer.Load()}}, nil
	}}
	r := newRig(t, "", nil, copts, func(r *rig) {
		idemmcp.AddTool(r.server, r.m, &mcp.Tool{Name: "delete_account"},
			func(_ context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
				rounds.Add(1)
				if len(req.Params.InputResponses) == 0 {
					return &mcp.CallToolResult{
						InputRequests: mcp.InputRequestMap{"confirm": &mcp.ElicitParams{Message: "Delete?"}},
						RequestState:  "round-1",
					}, nil, nil
				}
				n := effects.Add(1)
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("deleted #%d", n)}}}, nil, nil
			}, nil)
	})
	first, err := r.call("k-del", "delete_account", map[string]any{})
	require.NoError(t, err)
	require.Equal(t, "deleted #1", text(t, first))
	require.EqualValues(t, 2, rounds.Load(), "the input request, then the continuation")

	// The retry asks for input again (not stored), and its continuation,
	// with the same state and answers, is a replay.
	second, err := r.call("k-del", "delete_account", map[string]any{})
	require.NoError(t, err)
	require.Equal(t, "deleted #1", text(t, second))
	require.True(t, idemmcp.Replayed(second))
	require.EqualValues(t, 3, rounds.Load())
	require.EqualValues(t, 1, effects.Load())

	// Other answers to the same round with the same key: a conflict.
	answer.Store("no")
	_, err = r.call("k-del", "delete_account", map[string]any{})
	ref, ok := idemmcp.RefusalOf(err)
	require.True(t, ok, "a refusal, not %v", err)
	require.Equal(t, idemmcp.TypeConflict, ref.Type)
	require.EqualValues(t, 1, effects.Load())
}

func TestScopesWithOneKeyDoNotCollide(t *testing.T) {
	var orders atomic.Int32
	opts := &idemmcp.Options{Scope: func(_ context.Context, req *mcp.CallToolRequest) (string, error) {
		tenant, _ := req.Params.Meta["tenant"].(string)
		if tenant == "" {
			return "", &jsonrpc.Error{Code: -32001, Message: "unauthenticated"}
		}
		return tenant, nil
	}}
	r := newRig(t, "", opts, nil, shop(&orders))
	call := func(tenant string) (*mcp.CallToolResult, error) {
		return r.cs.CallTool(idemmcp.WithKey(t.Context(), "k-1"), &mcp.CallToolParams{Name: "create_order",
			Arguments: map[string]any{"sku": "A1", "qty": 1}, Meta: mcp.Meta{"tenant": tenant}})
	}
	alice, err := call("alice")
	require.NoError(t, err)
	bob, err := call("bob")
	require.NoError(t, err)
	require.False(t, idemmcp.Replayed(bob), "bob's key is not alice's")
	require.NotEqual(t, text(t, alice), text(t, bob))
	again, err := call("alice")
	require.NoError(t, err)
	require.True(t, idemmcp.Replayed(again))
	require.Equal(t, text(t, alice), text(t, again))
	require.EqualValues(t, 2, orders.Load())

	_, err = call("")
	require.ErrorContains(t, err, "unauthenticated")
	require.EqualValues(t, 2, orders.Load())
}

func TestServerRestartOnTheSameFileReplays(t *testing.T) {
	var orders atomic.Int32
	r := newRig(t, "", nil, nil, shop(&orders))
	args := map[string]any{"sku": "A1", "qty": 2}
	first, err := r.call("k-1", "create_order", args)
	require.NoError(t, err)
	r.close()

	r2 := newRig(t, r.path, nil, nil, shop(&orders))
	second := r2.requireReplay(t, "k-1", "create_order", args)
	require.Equal(t, text(t, first), text(t, second))
	require.EqualValues(t, 1, orders.Load())
}

func TestKeyPolicies(t *testing.T) {
	var orders, reads atomic.Int32
	r := newRig(t, "", nil, nil, func(r *rig) {
		shop(&orders)(r)
		idemmcp.AddTool(r.server, r.m, &mcp.Tool{Name: "get_order", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
			func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, created, error) {
				reads.Add(1)
				return nil, created{OrderID: "ord_1"}, nil
			}, nil)
		idemmcp.AddTool(r.server, r.m, &mcp.Tool{Name: "pay_order"}, createOrder(&orders),
			&idemmcp.Policy{Key: idemmcp.KeyFromArgs("sku", "qty")})
		idemmcp.AddTool(r.server, r.m, &mcp.Tool{Name: "log_event"}, createOrder(&orders),
			&idemmcp.Policy{RunUnkeyed: true})
	})

	t.Run("side effect without a key is refused", func(t *testing.T) {
		_, err := r.call("", "create_order", map[string]any{"sku": "A1", "qty": 1})
		ref, ok := idemmcp.RefusalOf(err)
		require.True(t, ok, "a refusal, not %v", err)
		require.Equal(t, idemmcp.TypeKeyRequired, ref.Type)
		require.EqualValues(t, idemmcp.CodeKeyRequired, ref.Code)
		require.Zero(t, orders.Load())
	})
	t.Run("invalid keys are refused", func(t *testing.T) {
		for _, key := range []any{" ", "a\nb", string(make([]byte, 256)), 42} {
			_, err := r.cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "create_order",
				Arguments: map[string]any{"sku": "A1", "qty": 1}, Meta: mcp.Meta{idemmcp.MetaKey: key}})
			ref, ok := idemmcp.RefusalOf(err)
			require.True(t, ok, "a refusal of %q, not %v", key, err)
			require.Equal(t, idemmcp.TypeKeyInvalid, ref.Type)
		}
		require.Zero(t, orders.Load())
	})
	t.Run("read-only passes through", func(t *testing.T) {
		for range 2 {
			res, err := r.call("", "get_order", map[string]any{})
			require.NoError(t, err)
			require.False(t, idemmcp.Replayed(res))
		}
		require.EqualValues(t, 2, reads.Load())
	})
	t.Run("natural key", func(t *testing.T) {
		before := orders.Load()
		first, err := r.call("", "pay_order", map[string]any{"sku": "A1", "qty": 3})
		require.NoError(t, err)
		second := r.requireReplay(t, "", "pay_order", map[string]any{"qty": 3.0, "sku": "A1"})
		require.Equal(t, text(t, first), text(t, second))
		require.Equal(t, before+1, orders.Load())
	})
	t.Run("unkeyed runs unprotected by option", func(t *testing.T) {
		before := orders.Load()
		for range 2 {
			_, err := r.call("", "log_event", map[string]any{"sku": "A1", "qty": 1})
			require.NoError(t, err)
		}
		require.Equal(t, before+2, orders.Load())
	})
	t.Run("minted keys dedupe nothing across retries", func(t *testing.T) {
		client := mcp.NewClient(&mcp.Implementation{Name: "agent2", Version: "v1"}, nil)
		client.AddSendingMiddleware(idemmcp.ClientMiddleware(&idemmcp.ClientOptions{MintKeys: true}))
		st, ct := mcp.NewInMemoryTransports()
		_, err := r.server.Connect(t.Context(), st, nil)
		require.NoError(t, err)
		cs, err := client.Connect(t.Context(), ct, nil)
		require.NoError(t, err)
		defer cs.Close()
		before := orders.Load()
		for range 2 {
			res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "create_order", Arguments: map[string]any{"sku": "A1", "qty": 1}})
			require.NoError(t, err)
			require.False(t, idemmcp.Replayed(res))
		}
		require.Equal(t, before+2, orders.Load())
	})
}

func TestStoredResultsAreCopies(t *testing.T) {
	shared := &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "v1"}}}
	var runs atomic.Int32
	r := newRig(t, "", nil, nil, func(r *rig) {
		idemmcp.AddRawTool(r.server, r.m, &mcp.Tool{Name: "note", InputSchema: json.RawMessage(`{"type":"object"}`)},
			func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				runs.Add(1)
				return shared, nil
			}, nil)
	})
	first, err := r.call("k-1", "note", map[string]any{})
	require.NoError(t, err)
	shared.Content[0].(*mcp.TextContent).Text = "v2" // the tool's object changes afterwards
	shared.Meta = mcp.Meta{"x": 1}
	second, err := r.call("k-1", "note", map[string]any{})
	require.NoError(t, err)
	require.Equal(t, "v1", text(t, first))
	require.Equal(t, "v1", text(t, second))
	require.NotContains(t, second.Meta, "x")
	require.True(t, idemmcp.Replayed(second))
	require.EqualValues(t, 1, runs.Load())
}

func TestDoTxToolCommitsItsEffectWithTheRecord(t *testing.T) {
	var runs atomic.Int32
	bucket := []byte("orders")
	r := newRig(t, "", nil, nil, func(r *rig) {
		idemmcp.AddTxTool(r.server, r.m, idem.TxDoer[*idem.Tx](r.e), &mcp.Tool{Name: "create_order"},
			func(_ context.Context, _ *mcp.CallToolRequest, in order, tx *idem.Tx) (*mcp.CallToolResult, created, error) {
				runs.Add(1)
				b, err := tx.Bucket(bucket)
				if err != nil {
					return nil, created{}, err
				}
				n, err := b.NextSequence()
				if err != nil {
					return nil, created{}, err
				}
				id := fmt.Sprintf("ord_%d", n)
				if err := b.Put([]byte(id), []byte(in.SKU)); err != nil {
					return nil, created{}, err
				}
				if in.Qty <= 0 {
					return nil, created{}, errors.New("quantity must be positive")
				}
				return nil, created{OrderID: id, Qty: in.Qty}, nil
			}, nil)
	})
	count := func() int {
		n := 0
		require.NoError(t, r.e.View(func(tx *bboltTx) error {
			if b := tx.Bucket(bucket); b != nil {
				n = b.Stats().KeyN
			}
			return nil
		}))
		return n
	}
	for range 2 {
		res, err := r.call("k-1", "create_order", map[string]any{"sku": "A1", "qty": 2})
		require.NoError(t, err)
		require.JSONEq(t, `{"order_id":"ord_1","qty":2}`, text(t, res))
	}
	require.Equal(t, 1, count())
	require.EqualValues(t, 1, runs.Load())

	// A tool error rolls the tool's writes back and is replayed.
	for range 2 {
		res, err := r.call("k-2", "create_order", map[string]any{"sku": "A1", "qty": 0})
		require.NoError(t, err)
		require.True(t, res.IsError)
	}
	require.Equal(t, 1, count())
	require.EqualValues(t, 2, runs.Load())
}

func TestToolsRegisteredWithTheSDKDirectly(t *testing.T) {
	var orders, reads atomic.Int32
	r := newRig(t, "", nil, nil, func(r *rig) {
		mcp.AddTool(r.server, &mcp.Tool{Name: "create_order"}, createOrder(&orders))
		mcp.AddTool(r.server, &mcp.Tool{Name: "get_order", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
			func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, created, error) {
				reads.Add(1)
				return nil, created{OrderID: "ord_1"}, nil
			})
	})
	args := map[string]any{"sku": "A1", "qty": 2}
	_, err := r.call("", "create_order", args)
	ref, ok := idemmcp.RefusalOf(err)
	require.True(t, ok, "a refusal, not %v", err)
	require.Equal(t, idemmcp.TypeKeyRequired, ref.Type)
	for range 2 {
		res, err := r.call("k-1", "create_order", args)
		require.NoError(t, err)
		require.JSONEq(t, `{"order_id":"ord_1","qty":2}`, text(t, res))
	}
	require.EqualValues(t, 1, orders.Load())
	for range 2 {
		_, err := r.call("", "get_order", map[string]any{})
		require.NoError(t, err, "read-only by its annotation")
	}
	require.EqualValues(t, 2, reads.Load())
	_, err = r.call("k-2", "no_such_tool", map[string]any{})
	require.ErrorContains(t, err, "unknown tool")
	_, ok = idemmcp.RefusalOf(err)
	require.False(t, ok, "the SDK's answer, not a refusal")
}

func TestStackedMiddlewareDedupesOnce(t *testing.T) {
	var orders atomic.Int32
	r := newRig(t, "", nil, nil, func(r *rig) {
		shop(&orders)(r)
		r.server.AddReceivingMiddleware(r.m.Wrap) // installed twice (go-sdk issue 174)
	})
	for range 2 {
		_, err := r.call("k-1", "create_order", map[string]any{"sku": "A1", "qty": 1})
		require.NoError(t, err, "the inner one passes through, no re-entrance")
	}
	require.EqualValues(t, 1, orders.Load())
}

func TestCancelledWaiterReturnsAndChangesNothing(t *testing.T) {
	var orders atomic.Int32
	r, started, release, waiting := waitingRig(t, &orders)
	args := map[string]any{"sku": "A1", "qty": 1}
	first := make(chan error, 1)
	go func() { _, err := r.call("k-1", "create_order", args); first <- err }()
	<-started
	ctx, cancel := context.WithCancel(idemmcp.WithKey(t.Context(), "k-1"))
	waiter := make(chan error, 1)
	go func() {
		_, err := r.cs.CallTool(ctx, &mcp.CallToolParams{Name: "create_order", Arguments: args})
		waiter <- err
	}()
	<-waiting
	cancel()
	require.ErrorIs(t, <-waiter, context.Canceled)
	close(release)
	require.NoError(t, <-first)
	r.requireReplay(t, "k-1", "create_order", args)
	require.EqualValues(t, 1, orders.Load())
}

func TestPanickingTxToolCommitsNothing(t *testing.T) {
	var runs atomic.Int32
	r := newRig(t, "", nil, nil, func(r *rig) {
		idemmcp.AddTxTool(r.server, r.m, idem.TxDoer[*idem.Tx](r.e), &mcp.Tool{Name: "create_order"},
			func(_ context.Context, _ *mcp.CallToolRequest, in order, tx *idem.Tx) (*mcp.CallToolResult, created, error) {
				b, err := tx.Bucket([]byte("orders"))
				if err != nil {
					return nil, created{}, err
				}
				if err := b.Put([]byte("ord_1"), []byte(in.SKU)); err != nil {
					return nil, created{}, err
				}
				if runs.Add(1) == 1 {
					panic("boom")
				}
				return nil, created{OrderID: "ord_1", Qty: in.Qty}, nil
			}, nil)
	})
	args := map[string]any{"sku": "A1", "qty": 1}
	_, err := r.call("k-1", "create_order", args)
	requireRPCCode(t, err, jsonrpc.CodeInternalError)
	keys := 0
	require.NoError(t, r.e.View(func(tx *bboltTx) error {
		if b := tx.Bucket([]byte("orders")); b != nil {
			keys = b.Stats().KeyN
		}
		return nil
	}))
	require.Zero(t, keys, "the panicking call's write rolled back")
	res, err := r.call("k-1", "create_order", args)
	require.NoError(t, err)
	require.False(t, idemmcp.Replayed(res), "nothing was stored: the retry runs")
	require.EqualValues(t, 2, runs.Load())
}

func TestStoreFailureRefusesAndRunsNothing(t *testing.T) {
	var orders atomic.Int32
	r := newRig(t, "", nil, nil, shop(&orders))
	require.NoError(t, r.e.Close()) // the store is gone
	_, err := r.call("k-1", "create_order", map[string]any{"sku": "A1", "qty": 1})
	ref, ok := idemmcp.RefusalOf(err)
	require.True(t, ok, "a refusal, not %v", err)
	require.Equal(t, idemmcp.TypeUnavailable, ref.Type)
	require.EqualValues(t, idemmcp.CodeUnavailable, ref.Code)
	require.Positive(t, ref.RetryAfter)
	require.Zero(t, orders.Load())
}

// The key rules are the engine's whether or not the stored key is a hash
// (Options.Scope): a key with white space at an end or a format character
// is refused as invalid in both cases, and the tool does not run.
func TestKeyRulesWithAndWithoutScope(t *testing.T) {
	for name, opts := range map[string]*idemmcp.Options{
		"unscoped": nil,
		"scoped":   {Scope: func(context.Context, *mcp.CallToolRequest) (string, error) { return "alice", nil }},
	} {
		t.Run(name, func(t *testing.T) {
			var orders atomic.Int32
			r := newRig(t, "", opts, nil, shop(&orders))
			for _, key := range []string{" k", "k\u00a0", "\ufeffk", "k\u200bk"} {
				_, err := r.call(key, "create_order", map[string]any{"sku": "A1", "qty": 1})
				ref, ok := idemmcp.RefusalOf(err)
				if !ok || ref.Type != idemmcp.TypeKeyInvalid {
					t.Errorf("key %q: %v", key, err)
				}
			}
			require.EqualValues(t, 0, orders.Load())
		})
	}
}

// A result over the engine's MaxResponseSize cannot be recorded: the key is
// done with idem.ErrResponseTooLarge stored. The caller whose call ran the
// tool still gets its result (the effect happened: an error saying the store
// failed and the tool did not run would be false), and a retry with the key
// gets an internal error, not a refusal that invites it to retry.
func TestResultOverTheEngineLimit(t *testing.T) {
	_, cs, runs := exportServer(t, nil, &idem.Options{PruneInterval: -1, MaxResponseSize: 1 << 10}, 4<<10)

	ctx := idemmcp.WithKey(t.Context(), "big-1")
	first, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "export", Arguments: map[string]any{}})
	require.NoError(t, err, "the caller whose call ran gets its result")
	require.Len(t, text(t, first), 4<<10)
	_, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "export", Arguments: map[string]any{}})
	require.Error(t, err)
	_, isRefusal := idemmcp.RefusalOf(err)
	require.False(t, isRefusal, "a retry cannot help: %v", err)
	require.EqualValues(t, 1, runs.Load())
}

// A Do tool whose outcome the store fails to record after the tool ran (here
// the done commit does not fit in the file's MaxSize: ErrFileFull) did its
// effect: its caller gets the tool's own result, as idemhttp answers with the
// handler's response, never a refusal saying the tool did not run. The key
// stays started, so a retry is an interrupted execution (the recovery
// policy decides). A DoTx tool's writes roll back with the failed commit, so
// there the refusal is true.
func TestStoreFailureAfterTheToolRanAnswersItsResult(t *testing.T) {
	e, cs, runs := exportServer(t, &idem.BoltOptions{MaxSize: 1 << 20}, &idem.Options{
		PruneInterval: -1, MaxResponseSize: 8 << 20}, 2<<20)

	first, err := cs.CallTool(idemmcp.WithKey(t.Context(), "full-1"), &mcp.CallToolParams{Name: "export", Arguments: map[string]any{}})
	require.NoError(t, err, "the tool ran: its caller gets its result")
	require.Len(t, text(t, first), 2<<20)
	require.EqualValues(t, 1, runs.Load())
	rec, err := e.Get("full-1")
	require.NoError(t, err)
	require.Equal(t, idem.StateStarted, rec.State, "the outcome was not recorded: an interrupted execution")
}

// exportServer opens an engine with opts and serves, behind the middleware,
// a Do tool "export" that answers size bytes of text and counts its runs; it
// returns the engine, a connected client and the count.
func exportServer(t *testing.T, file *idem.BoltOptions, opts *idem.Options, size int) (*idem.Engine, *mcp.ClientSession, *atomic.Int32) {
	t.Helper()
	e, err := idem.OpenFile(filepath.Join(t.TempDir(), "idem.db"), file, opts)
	require.NoError(t, err)
	t.Cleanup(func() { e.Close() })
	runs := new(atomic.Int32)
	server := mcp.NewServer(&mcp.Implementation{Name: "shop", Version: "v1"}, nil)
	m := idemmcp.New(e, nil)
	idemmcp.AddTool(server, m, &mcp.Tool{Name: "export"},
		func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
			runs.Add(1)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strings.Repeat("z", size)}}}, nil, nil
		}, nil)
	server.AddReceivingMiddleware(m.Wrap)
	st, ct := mcp.NewInMemoryTransports()
	_, err = server.Connect(t.Context(), st, nil)
	require.NoError(t, err)
	client := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil)
	client.AddSendingMiddleware(idemmcp.ClientMiddleware(nil))
	cs, err := client.Connect(t.Context(), ct, nil)
	require.NoError(t, err)
	t.Cleanup(func() { cs.Close() })
	return e, cs, runs
}
