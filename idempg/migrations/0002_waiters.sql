-- Version 2: waiters mark the records they wait on.
--
-- A record change notifies the key's waiters in other processes
-- (pg_notify at COMMIT) only when one is waiting: a waiter sets waiters on
-- the started record before it waits, and a completion, release or deletion
-- of a row whose waiters is set notifies. Postgres serialises the commits of
-- notifying transactions (their queue entries are written in commit order,
-- under one lock), so notifying on every completion would cost concurrent
-- calls their group commit.
ALTER TABLE {schema}.idem_records ADD COLUMN waiters boolean NOT NULL DEFAULT false;
