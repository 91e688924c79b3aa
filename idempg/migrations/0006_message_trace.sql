-- Version 6: outbox messages carry the trace context of the DoTx call that
-- enqueued them (idemcore.Message.Trace: for idemotel a W3C traceparent and
-- tracestate, at most idemcore.MaxMessageTrace = 512 bytes), so that each
-- delivery attempt's span links to the call's.
--
-- The column is NULL for a message without one, and for every message
-- enqueued before this version: adding a nullable column without a default
-- rewrites no row. A dead letter keeps its message's trace context, and so
-- does a dead letter retried (RetryDead). The version fences off builds that
-- would drop the column's value when they move a message to the dead letters
-- and back.
ALTER TABLE {schema}.idem_outbox ADD COLUMN trace bytea
	CONSTRAINT idem_outbox_trace_len CHECK (octet_length(trace) BETWEEN 1 AND 512);
ALTER TABLE {schema}.idem_dead_letters ADD COLUMN trace bytea
	CONSTRAINT idem_dead_letters_trace_len CHECK (octet_length(trace) BETWEEN 1 AND 512);
COMMENT ON COLUMN {schema}.idem_outbox.trace IS
	'The trace context of the call that enqueued the message (NULL: none), at most 512 bytes';
COMMENT ON COLUMN {schema}.idem_dead_letters.trace IS
	'The trace context of the call that enqueued the message (NULL: none), at most 512 bytes';
