-- Time: timestamps with fractional seconds, extract and date_part, date_trunc, timestamp
-- differences as intervals, age, to_char, to_timestamp, interval arithmetic, literals
-- without seconds or without a time, AT TIME ZONE; then the session's time zone is set to
-- Europe/Paris (daylight saving ends there on 2026-10-25 at 01:00 UTC), which changes how
-- timestamptz values are shown and read, for the rest of this file only.

SELECT id, ts FROM payments WHERE id IN (3, 6, 11, 22, 32, 50) ORDER BY id;

-- extract returns numeric (PostgreSQL 14 and later)
SELECT extract(year FROM ts), extract(month FROM ts), extract(day FROM ts), extract(hour FROM ts), extract(minute FROM ts) FROM payments WHERE id = 50;

SELECT id, extract(second FROM ts) FROM payments WHERE id IN (3, 6, 50, 1) ORDER BY id;

SELECT id, extract(epoch FROM ts) FROM payments WHERE id IN (1, 50) ORDER BY id;

SELECT extract(dow FROM ts), extract(isodow FROM ts), extract(doy FROM ts), extract(week FROM ts) FROM payments WHERE id = 19;

-- date_part returns double precision
SELECT date_part('hour', ts), date_part('minute', ts), date_part('second', ts) FROM payments WHERE id = 6;

SELECT extract(milliseconds FROM ts), extract(microseconds FROM ts) FROM payments WHERE id = 6;

SELECT extract(quarter FROM TIMESTAMP '2026-11-01 06:00'), extract(century FROM DATE '2026-01-01'), extract(epoch FROM INTERVAL '1 day 2 hours');

SELECT date_trunc('day', ts), date_trunc('hour', ts), date_trunc('month', ts), date_trunc('year', ts) FROM payments WHERE id = 50;

SELECT date_trunc('week', ts) FROM payments WHERE id = 19;

SELECT date_trunc('minute', ts), date_trunc('second', ts), date_trunc('milliseconds', ts) FROM payments WHERE id = 6;

SELECT max(ts) - min(ts) FROM payments;

SELECT id, ts - TIMESTAMP '2026-10-24 00:00' FROM payments WHERE id IN (1, 12, 50) ORDER BY id;

SELECT TIMESTAMP '2026-11-01 06:00' - TIMESTAMP '2026-10-31 05:30', TIMESTAMP '2026-10-24 00:00' - TIMESTAMP '2026-10-24 00:00:01.5';

SELECT age(TIMESTAMP '2026-11-01', TIMESTAMP '2025-09-15 12:00');

SELECT age(ts, TIMESTAMP '2026-01-01') FROM payments WHERE id = 50;

SELECT id, to_char(ts, 'YYYY-MM-DD HH24:MI:SS') FROM payments WHERE id IN (1, 50) ORDER BY id;

SELECT to_char(ts, 'Dy DD Mon YYYY HH12:MI AM'), to_char(ts, 'Day FMDD Month') FROM payments WHERE id = 50;

SELECT to_char(ts, 'YYYY-MM-DD"T"HH24:MI:SS.MS'), to_char(ts, 'US') FROM payments WHERE id = 6;

SELECT to_char(1234.5, '9999.99'), to_char(amount, 'FM999990.00'), to_char(-5, '000') FROM payments WHERE id = 9;

SELECT to_timestamp(1792829700);

SELECT to_timestamp('2026-11-01 06:00', 'YYYY-MM-DD HH24:MI');

SELECT to_date('01 Nov 2026', 'DD Mon YYYY');

SELECT ts + INTERVAL '90 minutes' FROM payments WHERE id = 1;

SELECT ts - INTERVAL '1 day 2 hours' FROM payments WHERE id = 1;

SELECT INTERVAL '1 hour' * 1.5, INTERVAL '1 day' / 4, INTERVAL '2 hours' + INTERVAL '45 minutes';

SELECT INTERVAL '1 month' / 2, INTERVAL '1.5 days', INTERVAL '36 hours', INTERVAL '90 seconds';

SELECT INTERVAL '1 year 2 months 3 days 04:05:06.5', -INTERVAL '1 day', INTERVAL '-1 hours';

SELECT DATE '2026-11-01' - DATE '2026-10-24', DATE '2026-10-31' + 1, DATE '2026-10-31' + INTERVAL '1 day';

-- a literal without seconds
SELECT id, ts FROM payments WHERE ts = '2026-11-01 06:00';

-- a date-only literal is midnight
SELECT id FROM payments WHERE ts >= '2026-11-01';

SELECT '2026-11-01'::timestamp, TIMESTAMP '2026-11-01 06:00', TIMESTAMP '2026-11-01T06:00:00';

-- more than six fractional digits are rounded to microseconds
SELECT TIMESTAMP '2026-10-24 08:15:00.1234567';

SELECT make_timestamp(2026, 11, 1, 6, 0, 0.5), make_date(2026, 2, 28), make_interval(days => 3, hours => 2);

SELECT justify_hours(INTERVAL '27 hours'), justify_days(INTERVAL '35 days'), justify_interval(INTERVAL '1 month -1 hour');

SELECT ts::date - DATE '2026-10-24' AS day_index, count(*) FROM payments GROUP BY 1 ORDER BY 1;

SELECT id, ts FROM payments WHERE ts::time BETWEEN '00:00' AND '01:00' ORDER BY id;

-- timestamp AT TIME ZONE 'UTC' is a timestamptz; timestamptz AT TIME ZONE zone the local time there
SELECT id, (ts AT TIME ZONE 'UTC') AT TIME ZONE 'Europe/Paris' FROM payments WHERE id IN (10, 11, 12, 13, 14) ORDER BY id;

SELECT id, ts AT TIME ZONE 'Europe/Paris' FROM payments WHERE id IN (12, 50) ORDER BY id;

SELECT TIMESTAMPTZ '2026-10-25 01:30:00+00', TIMESTAMPTZ '2026-10-25 03:30:00+02:00';

SELECT '2026-10-24 25:00'::timestamp;

SELECT '2026-13-01'::date;

SELECT current_setting('TimeZone');

SET TIME ZONE 'Europe/Paris';

SHOW TimeZone;

SELECT TIMESTAMPTZ '2026-10-25 00:30:00+00', TIMESTAMPTZ '2026-10-25 01:30:00+00';

-- a timestamp cast to timestamptz is read as local time in the session's zone
SELECT id, ts::timestamptz FROM payments WHERE id IN (10, 12, 50) ORDER BY id;

SELECT to_timestamp(1792829700);

SELECT id, ts AT TIME ZONE 'UTC' FROM payments WHERE id IN (10, 13, 50) ORDER BY id;

-- a literal without an offset is read in the session's zone
SELECT TIMESTAMPTZ '2026-11-01 06:00';

SELECT TIMESTAMPTZ '2026-11-01 06:00' AT TIME ZONE 'UTC';

SELECT date_trunc('day', TIMESTAMPTZ '2026-10-25 12:00:00+00');

SELECT TIMESTAMPTZ '2026-10-25 03:00:00+01' - TIMESTAMPTZ '2026-10-25 00:00:00+02';

SELECT extract(hour FROM TIMESTAMPTZ '2026-10-25 12:00:00+00'), extract(timezone FROM TIMESTAMPTZ '2026-07-01 12:00:00+00');

-- adding a day across the change keeps the local time; adding 24 hours does not
SELECT TIMESTAMPTZ '2026-10-24 12:00:00+00' + INTERVAL '1 day', TIMESTAMPTZ '2026-10-24 12:00:00+00' + INTERVAL '24 hours';

SELECT to_char(TIMESTAMPTZ '2026-10-25 12:00:00+00', 'YYYY-MM-DD HH24:MI TZ');

SELECT ts FROM payments WHERE id = 12;

SET TIME ZONE 'America/New_York';

SELECT TIMESTAMPTZ '2026-11-01 06:00:00+00', TIMESTAMPTZ '2026-11-01 07:00:00+00';

SET TIME ZONE 'Nowhere/City';

SHOW TimeZone;

RESET TimeZone;

SELECT TIMESTAMPTZ '2026-10-25 01:30:00+01';

SET TIME ZONE 'UTC';

SHOW TimeZone;

-- Intervals and times of day: their text and their types.
SELECT interval '1 day 2 hours', time '10:11:12.5', pg_typeof(interval '1 day'), pg_typeof(time '10:00'), timestamp '2026-01-02' - timestamp '2026-01-01 01:00';

-- Everyday queries, run against both servers in stop 101.
SELECT date_trunc('hour', ts), count(*) FROM payments GROUP BY 1 ORDER BY 1 LIMIT 5;

SELECT extract(dow FROM ts), extract(epoch FROM ts), extract(week FROM ts) FROM payments ORDER BY id LIMIT 3;

SELECT ts + interval '1 month', ts - interval '36 hours', age(timestamp '2026-12-01', ts) FROM payments ORDER BY id LIMIT 3;

SELECT to_char(timestamp '2026-03-05 14:07:09', 'YYYY-MM-DD HH24:MI:SS Dy Mon'), to_char(date '2026-03-05', 'DD/MM/YY');

SELECT '2026-02-28'::date + 1, '2026-12-31'::date - '2026-01-01'::date, date '2026-03-01' - interval '1 day';

SELECT make_date(2026, 2, 28), make_timestamp(2026, 1, 2, 3, 4, 5.5), to_timestamp(1800000000)::timestamp;

SELECT now() > timestamp '2020-01-01', current_date > date '2020-01-01';

-- More everyday queries (stop 101).
SELECT interval '1 day' * 2, interval '90 minutes', interval '1 year 2 months', interval '1 day' / 3, justify_hours(interval '30 hours');

SELECT extract(hour FROM interval '3 days 4 hours'), extract(epoch FROM interval '1 day'), date_part('minute', timestamp '2026-01-01 10:42:00');

SELECT '2026-01-31'::date + interval '1 month', timestamp '2026-03-29 01:30' + interval '1 hour', date_trunc('week', timestamp '2026-03-05 10:00');

SELECT '1 day'::interval > '23 hours'::interval, '2026-01-01'::date < '2026-01-02'::timestamp;

-- Queries over the metrics and the stream as a service would run them (stop 101).
SELECT date_bin(interval '15 minutes', ts, timestamp '2026-01-01'), count(*) FROM payments GROUP BY 1 ORDER BY 1 LIMIT 4;

SELECT id FROM payments WHERE ts >= timestamp '2026-10-25 01:00' AND ts < timestamp '2026-10-25 03:00' ORDER BY id;

SELECT id, ts::date, ts::time, to_char(ts, 'YYYY-MM-DD"T"HH24:MI:SS.MS') FROM payments ORDER BY id LIMIT 4;

SELECT extract(year FROM ts), extract(quarter FROM ts), extract(doy FROM ts), extract(isodow FROM ts), extract(microseconds FROM ts) FROM payments ORDER BY id LIMIT 3;

SELECT ts AT TIME ZONE 'Europe/Paris', (ts AT TIME ZONE 'UTC') AT TIME ZONE 'America/New_York' FROM payments ORDER BY id LIMIT 3;

SET TIME ZONE 'Europe/Paris';

SELECT timestamptz '2026-10-25 02:30:00+02', timestamptz '2026-10-25 01:30:00 UTC', '2026-03-29 02:30'::timestamptz;

SELECT date_trunc('day', timestamptz '2026-10-25 12:00:00+00'), extract(timezone FROM timestamptz '2026-07-01 00:00:00+00');

SELECT timestamptz '2026-10-24 12:00:00+02' + interval '1 day', timestamptz '2026-10-24 12:00:00+02' + interval '24 hours';

RESET TIME ZONE;

-- Interval text with signed numbers and a bare day count before a clock part; a 12-hour clock in timestamp text.
SELECT interval '-1 day +2 hours', interval '1 2:03:04', interval '+3 days', interval '1 day -2 hours';

SELECT timestamp '2024-01-01 1:30 PM', '2024-01-01 12:05 AM'::timestamp, '2024-01-01 12:00:00 pm'::timestamp;

SELECT '2024-01-01 13:30 PM'::timestamp;
