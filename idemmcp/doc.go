// Package idemmcp dedupes MCP tool calls for servers and clients built with
// the Go SDK (github.com/modelcontextprotocol/go-sdk, v1.8.0) through any idem
// engine (idem.Doer; idem.TxDoer for the DoTx tool form). A model that
// re-issues create_order after a lost response gets the first order back,
// marked as a replay, instead of a second order.
//
//	server.AddReceivingMiddleware(idemmcp.New(engine, nil).Wrap)
//
// dedupes the calls of tools registered with the SDK (mcp.AddTool), by the
// default Policy or Options.Tools. Registering a tool through this package
// gives it its own Policy and lets the middleware tell input the SDK refused
// from the handler's answers; AddTxTool is the DoTx form:
//
//	m := idemmcp.New(engine, nil)
//	idemmcp.AddTool(server, m, &mcp.Tool{Name: "create_order"}, createOrder, nil)
//	server.AddReceivingMiddleware(m.Wrap)
//
// and on the agent's side:
//
//	client.AddSendingMiddleware(idemmcp.ClientMiddleware(nil))
//	ctx := idemmcp.WithKey(ctx, intentID) // once per logical intent, reused on retries
//	res, err := session.CallTool(ctx, params)
//
// # The key
//
// Per tool, by Policy: the key comes from the request's _meta entry MetaKey
// ("io.github.idemkit/idempotency-key"; go-sdk drops unknown fields of
// params, so _meta is where it travels), or is a natural key over chosen
// arguments (KeyFromArgs, built with idem.KeyOf), or there is none (NoKey).
// The JSON-RPC id is never the key: a retry must carry a new id. Tools
// annotated read-only (ReadOnlyHint) pass through. A side-effecting tool
// called without a key is refused (CodeKeyRequired) unless its Policy says
// RunUnkeyed. A tool registered with the SDK directly is read-only if the
// server's tools/list shows it annotated so. With Options.Scope, the stored key is idem.KeyOf("idemmcp",
// scope, key): the key space follows the authenticated principal, never the
// connection or session. A continuation of a multi-round-trip call (one that
// carries InputResponses or RequestState) is a call of its own: its key is
// idem.KeyOf("idemmcp-continuation", key, RequestState), and its fingerprint
// covers RequestState and InputResponses, so the round that performs the
// effect is protected too.
//
// # What is stored and replayed
//
// The fingerprint (see Fingerprint) is the tool's name and its arguments as
// parsed JSON, never _meta. The outcome of the tool's handling is stored as
// a serialized copy (never an object the server goes on to modify: go-sdk
// adds its _meta entries to results after the middleware returns) and every
// answer, the first included, is a new object decoded from it. Replayed
// results carry MetaReplayed (true) in their _meta; a replayed protocol error
// is the stored error as it was (a JSON-RPC error has no _meta).
//
//   - a result: stored and replayed;
//   - a result with IsError (a typed handler's error): stored and replayed;
//   - a protocol error (a raw handler's error, a *jsonrpc.Error): stored with
//     its code, message and data, and replayed;
//   - input the SDK refused before the handler ran (schema validation of a
//     typed tool, unmarshaling): answered, not stored, the key stays free.
//     The middleware knows the handler did not run for tools registered with
//     AddTool, AddRawTool or AddTxTool; for a tool registered with the SDK
//     directly, it recognises the SDK's schema-validation answer (an IsError
//     result whose error starts with `validating "arguments": `);
//   - an error wrapped by idem.Retryable (a protocol error, or a typed
//     handler's error, which go-sdk keeps as CallToolResult.GetError on the
//     server): answered, not stored, the key is free;
//   - a result with InputRequests: not final, answered, not stored;
//   - an outcome over the engine's MaxResponseSize: answered to the caller
//     whose call ran the tool, not stored; the key is done with
//     idem.ErrResponseTooLarge, and a retry gets a JSON-RPC internal error;
//   - a context error (the request was cancelled): an interrupted execution
//     for Do (the engine's recovery policy decides on the next call); for
//     DoTx nothing committed and the key is free;
//   - a panic in the tool: logged (Options.Logger) and answered with a
//     JSON-RPC internal error; the server keeps serving. It is an interrupted
//     execution, as after a crash: for Do the next call with the key
//     re-executes with idem.CallFrom(ctx).Recovered set; for DoTx nothing
//     committed.
//
// In the DoTx form (AddTxTool), the handler's writes commit in the same
// transaction as the record, so a kill at any point leaves either both or
// neither; a tool error rolls the writes back and is stored alone.
//
// # Refusals
//
// A refusal is a JSON-RPC error with one of the codes below and data
// {"type": …, "retryAfter": seconds}; nothing is stored for it, and
// RefusalOf reads it on the client side.
//
//	code    data.type                       when
//	-32060  idempotency_key_required        side-effecting tool, no key
//	-32061  idempotency_key_invalid         key blank, > 255 bytes, not UTF-8, white space at an end, control or format characters, not a string
//	-32062  idempotency_key_conflict        the key was used with another tool or other arguments
//	-32063  idempotency_key_in_progress     the first call with the key still runs (retryAfter)
//	-32064  idempotency_key_incomplete      interrupted execution under idem.RecoverRefuse
//	-32065  idempotency_store_unavailable   the store failed; the tool did not run (retryAfter)
//
// A duplicate that arrives while the first call with its key runs in this
// middleware waits for it, at most Options.MaxWait, and answers with its
// outcome as a replay (InProgressWait), or is refused at once
// (InProgressRefuse); it never blocks forever, and a waiter whose request is
// cancelled returns at once. A duplicate with other arguments is refused as a
// conflict at once. Across processes (a multi-process backend), the engine's
// own InFlight policy applies: open it with idem.InFlightFail for a bounded
// refusal there too.
//
// # Caveats
//
//   - The go-sdk v1.8.0 client never re-sends a tools/call by itself: the
//     retries are the agent's, and the key must come from the agent's
//     intent (WithKey). ClientOptions.MintKeys mints a key per call, which
//     dedupes nothing across the caller's own retries.
//   - Install the middleware once, when the server is built:
//     AddReceivingMiddleware called per request stacks it (go-sdk issue 174).
//   - A tool of the DoTx form may run more than once per call and must touch
//     nothing but its transaction (see idem.Engine.DoTx).
package idemmcp
