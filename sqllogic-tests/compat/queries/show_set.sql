-- SHOW and SET: the settings clients read, a session setting changed, shown, and reset
-- (statement_timeout is shown as PostgreSQL shows it: with the largest exact unit), an
-- unknown setting (42704) and a bad value (22023). PostgreSQL is started with
-- timezone=UTC, as Eddy's sessions start.

SHOW TimeZone;

SHOW timezone;

SHOW DateStyle;

SHOW standard_conforming_strings;

SHOW client_encoding;

SHOW server_encoding;

SHOW integer_datetimes;

SHOW IntervalStyle;

SHOW statement_timeout;

SET statement_timeout = '1s';

SHOW statement_timeout;

SET statement_timeout = 5000;

SHOW statement_timeout;

SET statement_timeout TO '90s';

SHOW statement_timeout;

SET SESSION statement_timeout = '10min';

SHOW statement_timeout;

SET statement_timeout = '1500ms';

SHOW statement_timeout;

RESET statement_timeout;

SHOW statement_timeout;

SET statement_timeout = 'abc';

SHOW nosuch;

SET nosuch_setting = 1;

SHOW synchronous_commit;

SET synchronous_commit = off;

SHOW synchronous_commit;

SET synchronous_commit = 'bogus';

RESET ALL;

SHOW synchronous_commit;

SELECT current_setting('statement_timeout');

SET application_name = 'compat';

SHOW application_name;

SELECT set_config('statement_timeout', '2s', false);

SHOW statement_timeout;

SET statement_timeout TO DEFAULT;

SHOW statement_timeout;

SHOW transaction_isolation;

SHOW max_identifier_length;

SHOW search_path;

SHOW extra_float_digits;

SHOW bytea_output;

SELECT current_setting('nosuch');

SELECT current_setting('nosuch', true);

SET TIME ZONE 'UTC';

SHOW TimeZone;
