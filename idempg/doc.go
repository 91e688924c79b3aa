// Package idempg is idem's Postgres backend (github.com/idemkit/idem/idempg,
// a module of its own, so that users of the bbolt engine never download a
// Postgres driver; its users get the root module github.com/idemkit/idem as
// well, whose types and errors it shares): the same contract as the bbolt
// engine, for several processes or machines that share one database, through
// pgx/v5.
//
// # Schema
//
// The tables live in one schema (Options.Schema, default "public"): records
// (idem_records), the outbox (idem_outbox), dead letters (idem_dead_letters)
// and the applied schema versions (idem_migrations). Migrate creates and
// upgrades them, as does the CLI:
//
//	idem migrate --pg 'postgres://user@host/db' [--schema idem]
//
// Migrations are versioned, applied in order, each in a transaction of its
// own, idempotent, and safe to run from several processes at once without
// advisory locks (so they also run on engines where those are stubs).
//
// # Clocks
//
// Leases are judged by the database's clock (now()), never a client's, so
// that processes on machines whose clocks disagree agree on who owns a key.
// Retention and the outbox's backoff use the engine's clock (Options.Now), as
// on the bbolt backend.
package idempg
