// Package idemcore is idem's engine without its storage: the state machine
// of the contract (DESIGN.md), written once for every backend, and its
// vocabulary. Engine[T] runs Do and DoTx over a Backend[T]: key validation,
// fingerprints, the replay fast path and cache, the per-key singleflight,
// the decision table on a stored record, fn's context and the lease
// heartbeat, the classification of fn's outcome, the operator calls, the
// pruner and the outbox dispatcher. Options, Result, Record, Message, Error,
// OpError, the sentinels, Call and the observer's Event are its words, and
// every backend's: github.com/idemkit/idem (a bbolt file) aliases them, and
// github.com/idemkit/idem/idempg (Postgres) uses them as they are.
//
// Storage sits behind Backend, split by role (Records, Outbox, Waiter), so
// this package imports no storage driver: `go list -deps` of it, and of the
// adapters built on it (idemhttp, idemmcp, idemprom), names neither bbolt
// nor pgx. A backend imports this package, never the reverse, as River's
// drivers import riverdriver and litestream's replica clients implement
// ReplicaClient; the conformance suite, github.com/idemkit/idem/idemtest,
// runs on any Backend. Adapters take a Doer (or a TxDoer), which every
// backend's engine implements.
package idemcore
