-- Version 4: every time is the database's clock.
--
-- Up to version 3 the times of records and messages (the *_ns columns)
-- were the writing engine's clock (idem.Options.Now), and every engine
-- judged retention, pruning and the outbox's due times by its own: one host
-- whose clock ran ahead re-ran the others' keys and pruned their records,
-- one that ran behind wrote records the others took for expired. From this
-- version they are stamped by the database's clock (statement_timestamp(),
-- as Unix nanoseconds in whole microseconds) and judged by it, as leases
-- always were, so that every process sharing the schema agrees on them.
--
-- The columns keep their type and unit, and the rows their times. The
-- version fences builds that judge by their own clock off the schema: such
-- a build refuses a schema newer than its own at Open.
COMMENT ON COLUMN {schema}.idem_records.started_ns IS
	'When the current attempt was claimed: the database''s clock, Unix ns';
COMMENT ON COLUMN {schema}.idem_records.completed_ns IS
	'When the record became done (0 while started): the database''s clock, Unix ns';
COMMENT ON COLUMN {schema}.idem_records.expires_ns IS
	'The end of the record''s own window (completed or started + retention_ns; 0: never), by the database''s clock, Unix ns';
COMMENT ON COLUMN {schema}.idem_outbox.enqueued_ns IS
	'When the message was enqueued: the database''s clock, Unix ns';
COMMENT ON COLUMN {schema}.idem_outbox.next_attempt_ns IS
	'When a failed message may be tried again (0: at once): the database''s clock, Unix ns';
COMMENT ON COLUMN {schema}.idem_dead_letters.dead_ns IS
	'When the message died: the database''s clock, Unix ns';
COMMENT ON COLUMN {schema}.idem_dead_letters.expires_ns IS
	'The end of the dead letter''s retention (dead_ns + retention_ns), by the database''s clock, Unix ns';
