-- Version 7: idem_records loses its four CHECK constraints (state in 1 or 2,
-- attempt at least 1, and the lease columns set exactly while a record is
-- started). Postgres checks a table's CHECK constraints on every insert and
-- update, and with them a claim and a completion each took 57-72 µs more
-- on the bench machine, of statements of 400-480 µs in all (bench/RESULTS.md,
-- "Issue 21: the row's own costs"). The backend is the table's only
-- writer, and every statement that writes a row sets those columns
-- together (TestRowInvariants checks the rules after every kind of write). A
-- row broken by hand is still caught where it is read: a state other than
-- 1 or 2, or an attempt below 1, decodes to ErrCorrupt (row.go), and so
-- does a started row without an owner or a lease where its lease is judged
-- (Owner, lookup.go).
--
-- Dropping a constraint rewrites no row and takes the table's lock only for
-- the catalog change. NOT NULL stays on every column that had it.
ALTER TABLE {schema}.idem_records
	DROP CONSTRAINT IF EXISTS idem_records_state_check,
	DROP CONSTRAINT IF EXISTS idem_records_attempt_check,
	DROP CONSTRAINT IF EXISTS idem_records_check,
	DROP CONSTRAINT IF EXISTS idem_records_check1;
