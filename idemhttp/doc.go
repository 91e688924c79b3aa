// Package idemhttp puts an idem engine in front of an HTTP API: a server
// middleware that answers the Idempotency-Key header (IETF
// draft-ietf-httpapi-idempotency-key-header, revision 07, and Stripe's
// behaviour), and a client transport that gives each logical request one key
// and retries it. Both are one line:
//
//	srv.Handler = idemhttp.Middleware(engine, &idemhttp.Options{Scope: userOf})(mux)
//	client := &http.Client{Transport: &idemhttp.Transport{}}
//
// The middleware works over idem.Doer, so over any backend's engine.
//
// # Keys
//
// The key is the Idempotency-Key header's value: a Structured Field String
// (RFC 8941, `"…"`, printable ASCII) as the draft specifies, or, when the
// value is not a valid sf-string, the raw value (stripe-go sends unquoted
// keys such as 1796107146426231270_GaGLhw, which are not sf-tokens either).
// So `"abc"` and abc are the same key. A key is 1 to idem.MaxKeyLen (255)
// bytes of UTF-8 (Stripe's limit) that meets the engine's rules
// (idem.ErrInvalidKey: no white space at either end, no control or format
// character), with or without Options.Scope.
//
// Without Options.Scope there is ONE PRINCIPAL: every caller shares one key
// space, and a caller that sends another caller's key gets 422 (so learns the
// key exists) or, with the same request, the other caller's stored response.
// With Scope, the stored key is StoredKey(scope, key), so two principals'
// equal keys never meet. Put the middleware after authentication: 401 and
// 403 are never stored.
//
// # What defines a request, what is stored
//
// The fingerprint is the method, the escaped path, the raw query (order
// matters) and the raw body, at most Options.MaxBodySize bytes; headers are
// not part of it. The stored response is the status, the headers listed in
// Options.Headers (never Set-Cookie, Date or Content-Length), the trailers
// and the body; the body and the trailers together at most
// Options.MaxResponseSize bytes. A handler's response is buffered whole and
// sent when the handler returns (Flush does nothing meanwhile); a response
// that passes the limit streams to its caller from there on and is not
// stored, and one whose trailers pass it is sent whole and not stored. A
// refusal before the handler began stores nothing (Stripe's rule): 400,
// 413, 422, 409, 503.
//
// The handler's writer behaves as net/http's own: the header is sent as it
// stood when the status was written (WriteHeader, or the first Write), and
// later changes are lost but for trailers: the fields the Trailer header
// declared then, with their values when the handler returns, and the fields
// set through http.TrailerPrefix. The first caller and every replay get
// them as trailers, after the body (without a Content-Length: HTTP/1.1
// sends trailers only in the chunked encoding). All of them are stored,
// whatever Options.Headers lists, except the fields that are never stored;
// a field RFC 9110 forbids in trailers (Content-Length, Content-Type,
// Cache-Control, …, as net/http refuses them) is neither declared nor sent.
//
// The stored form is versioned by its first byte. Version 1 holds the
// status, the headers and the body; version 2 adds the trailers. A response
// without trailers is written in version 1, which earlier versions of this
// package wrote and read too, so programs of two versions can share a store;
// a response with trailers is written in version 2, which an earlier
// version replays as raw bytes (200 application/octet-stream): upgrade
// every program that shares a store before a handler behind it sends
// trailers. Both versions replay.
//
// Every response to a request with a key carries Idempotency-Retention: the
// retention window in seconds (86400 for the engine's default of 24 hours):
// how long after its completion a request is replayed. Past it, the key is
// new again.
//
// # Statuses, and what clients do with them
//
// Each refusal is RFC 9457 problem details (application/problem+json) with a
// type URI of this package (Problem* constants) and a Stripe-shaped "error"
// member ({"type":"idempotency_error","code":…,"message":…}), so that
// stripe-go turns it into a *stripe.Error and stops retrying, as it does
// against Stripe. stripe-go (v82) retries, twice by default and with the same
// key, connection errors and any error response whose body is not
// Stripe-shaped, without reading Retry-After; it does not retry a
// Stripe-shaped error (except a 429 lock_timeout). go-retryablehttp (v0.7.8,
// default policy) retries connection errors, 429 and 5xx except 501 (POST
// included), honours Retry-After on 429 and 503, and does not retry 409; it
// sets no key itself; it retries a replayed 429 or 5xx too, each retry
// getting the same stored answer. This package's Transport retries, with the
// same key, connection errors, the in-progress 409 (ProblemInProgress, or
// Stripe's idempotency_key_in_use) and a 429, 502, 503 or 504 that is not a
// replay, and only those: a replay (Idempotent-Replayed: true) is a stored
// answer that no retry changes, whatever its status and its Retry-After, and
// any other 409 is the handler's own. So a handler's 503 reaches the
// Transport twice (the first answer, then its replay), and its 409 once.
//
//	case                                status, headers                    stripe-go                        go-retryablehttp                   Transport
//	first request                       the handler's; stored              its own rules (see above)        its own rules                      its own rules
//	replay                              stored status, headers, body,      as for the first answer          as for the first answer (429 and   returns it, never retried
//	                                    Idempotent-Replayed: true                                           5xx retried, to the same answer)
//	no key on POST/PATCH                400 ProblemKeyMissing              never: it always sends a key     returns the 400                    never: it always sends a key
//	key empty, repeated, too long       400 ProblemKeyInvalid              *stripe.Error, no retry          returns the 400                    returns the 400
//	same key, other request             422 ProblemKeyMismatch             *stripe.IdempotencyError,        returns the 422                    returns the 422
//	                                                                       no retry
//	first request still running,        409 ProblemInProgress,             *stripe.Error idempotency_error  returns the 409 (not retried)      waits Retry-After, retries
//	  engine under idem.InFlightFail    Retry-After (Options.RetryAfter    code idempotency_key_in_use,
//	                                    of the engine, rounded up)         no retry: retry with the key
//	first request still running,        the first request's answer,        as for a replay                  as for a replay                    as for a replay
//	  idem.InFlightWait (default)       replayed, after waiting
//	first execution interrupted         409 ProblemIncomplete,             *stripe.Error, no retry          returns the 409                    returns the 409
//	  (RecoverRefuse), or the awaited   no Retry-After
//	  first request ended without one
//	key resolved by an operator with    that answer, replayed,             as for the first answer          as for the first answer            as for the first answer
//	  EncodeResponse's bytes (admin     Idempotent-Replayed: true
//	  "http" form)
//	key resolved with other bytes       200, the bytes as body,            its own rules (a 200)            returns the 200                    returns the 200
//	  (admin "response", idem resolve   Content-Type application/
//	  --response)                       octet-stream, Idempotent-Replayed
//	key resolved with an error, or      500 ProblemStoredError (stored     *stripe.Error, no retry          retries RetryMax times (each gets  returns the 500
//	  any stored *idem.Error            code and message), Idempotent-                                      the same 500), then fails
//	                                    Replayed: true
//	stored bytes in the format's        500 ProblemStoredResponseCorrupt   *stripe.Error, no retry          retries RetryMax times, then fails returns the 500
//	  version that do not decode
//	request body over MaxBodySize       413 ProblemBodyTooLarge            *stripe.Error, no retry          returns the 413                    returns the 413
//	replay of a response over the       500 ProblemResponseNotStored       *stripe.Error, no retry          retries RetryMax times (each gets  returns the 500
//	  size limit (the first caller                                                                          the same 500), then fails
//	  got all of it)
//	the store fails (disk, database,    503 ProblemStoreUnavailable,       *stripe.Error api_error,         retries after Retry-After          retries after Retry-After,
//	  lock, engine closed): handler     Retry-After (StoreRetryAfter)      no retry                                                            within its deadline
//	  not run
//	handler panics                      none: net/http drops the           retries: the engine's recovery   retries likewise                   retries likewise
//	                                    connection; the key stays started  policy answers (re-execute by
//	                                                                       default, idem.CallFrom tells
//	                                                                       Recovered; or 409 Incomplete)
//	handler calls NotStored, or         the handler's; not stored, key     retries it if the body is not    retries 429 and 5xx                retries 429, 502, 503, 504
//	  answers 401 or 403                freed                              Stripe-shaped: the handler runs
//	                                                                       again
//
// An operator resolves an interrupted key (409 ProblemIncomplete) with
// Engine.Resolve, idem resolve or the admin handler's POST
// /records/resolve. To make retries get a chosen HTTP answer, store
// EncodeResponse(status, header, body), or send the admin handler
// {"http": {"status": 201, "headers": {"Content-Type": ["application/json"]},
// "body": "…"}}. Stored bytes not in the middleware's format (their first
// byte is not one of its versions, 1 or 2) replay as 200
// application/octet-stream, and a stored error as 500 ProblemStoredError,
// as the table says.
//
// A 409 in progress is answered only under idem.InFlightFail, which the
// engine's Options choose; under the default idem.InFlightWait a duplicate
// waits for the first request and gets its replay, and a waiting duplicate
// whose client goes away changes nothing.
//
// # The handler
//
// The handler's context is the engine's fn context: it keeps the request's
// values but does not end when the client goes away: the outcome is
// recorded, and the client's retry gets it. It ends when the engine closes
// and, on idempg, the moment the handler's lease has passed (cause
// idem.ErrLeaseLost: another replica may run the key again); an answer
// written after that reaches its caller but is not stored, and the key stays
// started. A handler that panics leaves an interrupted
// execution (the engine's recovery policy decides what the next request with
// the key gets). If the engine cannot record the handler's outcome (a failed
// commit), the handler's caller still gets its answer; the key then stays
// started, as after a crash.
//
// # Shutdown order
//
// Shut the HTTP server down first, then close the engine:
//
//	srv.Shutdown(ctx) // stop taking requests, let running handlers finish and record
//	engine.Close()    // then close the file
//
// Closing the engine first cancels the context of running handlers and
// leaves their started records to the recovery policy (re-executed at the
// next request with the key, at-least-once), and answers every request that
// is still arriving with 503. The example in example/ does it in this order.
package idemhttp
