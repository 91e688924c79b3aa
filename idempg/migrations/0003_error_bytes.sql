-- Version 3: error texts as bytes.
--
-- fn's stored error (its code and message) and an outbox message's last
-- error are Go strings: any bytes, NUL and invalid UTF-8 included, which a
-- text column refuses. They are stored as bytea, exactly as given, so that
-- they replay as on the bbolt backend. Existing texts keep their bytes
-- (convert_to in the database's encoding, UTF8 for idem's schemas).
ALTER TABLE {schema}.idem_records
	ALTER COLUMN error_code DROP DEFAULT,
	ALTER COLUMN error_code TYPE bytea USING convert_to(error_code, 'UTF8'),
	ALTER COLUMN error_code SET DEFAULT ''::bytea,
	ALTER COLUMN error_message DROP DEFAULT,
	ALTER COLUMN error_message TYPE bytea USING convert_to(error_message, 'UTF8'),
	ALTER COLUMN error_message SET DEFAULT ''::bytea;
ALTER TABLE {schema}.idem_outbox
	ALTER COLUMN last_error DROP DEFAULT,
	ALTER COLUMN last_error TYPE bytea USING convert_to(last_error, 'UTF8'),
	ALTER COLUMN last_error SET DEFAULT ''::bytea;
ALTER TABLE {schema}.idem_dead_letters
	ALTER COLUMN last_error DROP DEFAULT,
	ALTER COLUMN last_error TYPE bytea USING convert_to(last_error, 'UTF8'),
	ALTER COLUMN last_error SET DEFAULT ''::bytea;
