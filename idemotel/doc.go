// Package idemotel reports idem's engine to OpenTelemetry: traces and
// metrics of every call, fn and outbox delivery, on either backend (the
// bbolt engine, idempg), through the engine's idemcore.Tracer and
// idemcore.Observer hooks. It imports idemcore and OpenTelemetry's API only
// (never bbolt, never pgx).
//
//	tel, err := idemotel.New(nil) // the global providers
//	opts := &idem.Options{}
//	tel.Install(opts) // opts.Tracer and opts.Observer
//	eng, err := idem.Open(path, opts)
//	err = tel.ObserveBacklog(eng.OutboxBacklog) // the outbox gauges
//
// # Spans
//
//   - idem.do, idem.dotx: one per call, a child of the span in the caller's
//     ctx (otelhttp's server span, say). Attributes: idem.operation,
//     idem.backend, and at the end idem.outcome (executed, recovered,
//     replayed, waited, refused, failed; idemcore.CallOutcome), idem.attempt,
//     idem.wait.duration (seconds, if it waited), error.type for a refusal
//     or a failure (the sentinel's name: "ErrFingerprintMismatch",
//     "ErrInProgress", ...), idem.stored_error for an answer that is a
//     recorded error of fn's. The status is Error only for the engine's own
//     failure (idemcore.CallEnd.EngineFailed): never for a replay, a
//     refusal or fn's recorded error.
//   - idem.fn: each run of fn, a child of the call's span; fn's context
//     carries it, so fn's own spans (a database call, an HTTP request) are
//     its children. Attributes idem.attempt, idem.recovered, idem.fn.run; an
//     Error status with error.type when fn returns an error or panics.
//   - idem.deliver: each outbox delivery attempt (kind consumer, the
//     messaging conventions' "process" span: messaging.system "idem",
//     messaging.destination.name the topic, messaging.message.id the Seq,
//     messaging.message.delivery_attempt), linked to the idem.dotx span that
//     enqueued the message through the W3C trace context stored with it
//     (idemcore.Message.Trace); idem.outcome (delivered, retry, dead_letter,
//     abandoned), idem.dead_letter, an Error status when the handler failed.
//
// No attribute, metric label, status description or event carries an
// idempotency key, a fingerprint, a response, a payload or an error's text:
// keys may carry user data (Stripe's guidance), and error texts may quote
// it. error.type carries the sentinel's name only. Options.KeyHashSecret
// adds an HMAC of the key (idem.key.hash), to find one key's spans.
//
// # Metrics
//
//   - idem.calls {call}, idem.call.duration (s): by idem.operation,
//     idem.outcome and error.type (refusals and failures).
//   - idem.call.active {call}: calls in progress, by idem.operation.
//   - idem.fn.duration (s), idem.wait.duration (s), idem.commit.duration (s).
//   - idem.outbox.deliveries {attempt}, idem.outbox.delivery.duration (s): by
//     messaging.destination.name and idem.outcome.
//   - idem.outbox.dead_lettered {message}, idem.pruned {record}.
//   - idem.outbox.backlog, idem.outbox.dead_letters {message}: gauges read
//     from the store at each collection through ObserveBacklog (the
//     engine's OutboxBacklog: on Postgres one statement counting two tables
//     per collection).
package idemotel
