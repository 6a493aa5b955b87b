-- Casts: numeric to integer rounds half away from zero, float to integer rounds half to
-- even; text of floats is the shortest exact form; bad input gives 22P02, out of range
-- 22003, a bad date 22007 or 22008; pg_typeof names each expression's type.

SELECT 3.7::int, (-0.5)::int, 0.5::int, 1.5::int, 2.5::int;

SELECT 3.7::float8::int, 2.5::float8::int, (-0.5)::float8::int, 3.5::float8::int;

SELECT '42'::int, ' 42 '::int, '-7'::bigint;

SELECT 'abc'::int;

SELECT '3.5'::int;

SELECT 12.5::text, 1e6::text, 0.1::float8::text;

SELECT id, amount::text FROM payments WHERE id IN (7, 9, 12, 19, 15) ORDER BY id;

SELECT id, amount::int FROM payments WHERE id IN (3, 6, 15, 24, 1) ORDER BY id;

SELECT id, amount::numeric FROM payments WHERE id IN (7, 9, 12) ORDER BY id;

SELECT 1e6::numeric, 1.50::numeric, 0.1::numeric + 0.2::numeric;

SELECT '2026-11-01'::date, '2026-11-01 06:00'::timestamp, DATE '2026-11-01' + 1;

SELECT ts::date, ts::time FROM payments WHERE id IN (3, 50) ORDER BY id;

SELECT '2026-02-30'::date;

SELECT 'not a date'::date;

SELECT 'true'::boolean, 'yes'::boolean, 'f'::boolean, 'off'::boolean;

SELECT 'maybe'::boolean;

SELECT CAST(qty AS text) || 'x' FROM payments WHERE id = 1;

SELECT CAST('12.5' AS double precision) * 2;

SELECT '1e3'::float8, '-0'::float8, 'NaN'::float8, 'Infinity'::float8, '-inf'::float8;

SELECT 3000000000::int;

SELECT 32768::smallint;

SELECT '9223372036854775808'::bigint;

SELECT 1::boolean, 0::boolean;

-- an explicit cast to varchar(n) truncates
SELECT 'abc'::varchar(2);

SELECT 10::numeric(5,2), 3.14159::numeric(10,3);

SELECT 12345.6::numeric(4,1);

SELECT qty::bigint * 3000000000 FROM payments WHERE id = 24;

SELECT id::text || '-' || card FROM payments WHERE id <= 3 ORDER BY id;

SELECT pg_typeof(1), pg_typeof(1.5), pg_typeof('a'::text), pg_typeof(1e6), pg_typeof(2147483648);

SELECT pg_typeof(amount), pg_typeof(qty), pg_typeof(ts), pg_typeof(id), pg_typeof(card) FROM payments WHERE id = 1;

SELECT pg_typeof(sum(qty)), pg_typeof(sum(amount)), pg_typeof(avg(qty)), pg_typeof(count(*)) FROM payments;

SELECT '10:30'::time, '1 day 2 hours'::interval;

SELECT '0.1'::real, 0.1::real::float8, (1.0 / 3)::real;

SELECT id, amount::real FROM payments WHERE id IN (9, 12) ORDER BY id;

SELECT '1e6'::float8, 1e15::float8, 1e16::float8, 123456789012345678::float8, 0.0001::float8, 0.00001::float8;

SELECT ts::text FROM payments WHERE id IN (3, 6, 22) ORDER BY id;

-- PostgreSQL's timestamp (without time zone) ignores a zone offset in its input
SELECT '2026-10-25 01:30:00+02'::timestamp;

SELECT '2026-10-25 01:30:00+02'::timestamptz;

SELECT '  12.50 '::numeric, '-1.5e2'::numeric, '1,5'::text;

SELECT CAST(amount AS integer) + qty FROM payments WHERE id = 4;

SELECT '2147483647'::int + 0, '-2147483648'::int;

SELECT 'x'::text::varchar, 123::text::int;

-- typed literals are casts of their text: a numeric keeps the scale it is written with
SELECT NUMERIC '1.50', DECIMAL '2.500' + 1, NUMERIC(5,1) '1.25', pg_typeof(NUMERIC '7');

SELECT JSON '{"b": 1,  "a": 2}', JSONB '{"b": 1.50, "a": 2}';

SELECT BOOLEAN 'yes', INTEGER '42' + 1, DATE '2026-03-04' + 1, TIMESTAMP '2026-01-01 10:00' + INTERVAL '1 day 2 hours';

-- Everyday queries, run against both servers in stop 101.
SELECT 1::bool, 'yes'::bool, 't'::boolean AND NULL, NULL OR true, NOT NULL;

SELECT 1e3::int, '12'::int + 1, '3.5'::float8::int, 32767::int2, (-2147483648)::int4;

-- More everyday queries (stop 101).
SELECT x, x::text, x::varchar(2), x::char(5) FROM (VALUES ('hello')) t(x);

SELECT 'true'::boolean::int, 3.9::float8::bigint, '  42 '::int, '1e3'::float8::int, 'NaN'::float8;

-- char(n): cut to n characters (1 without a length); trailing blanks do not count
SELECT 'abcdef'::char(3), 'abcdef'::character(2), 'abc'::char, CAST('xyz' AS CHARACTER(3));

SELECT length('ab '::char(5)), length('a   '::bpchar), 'ab'::char(5) = 'ab  '::char(3), 'ab'::char(5) || 'x', '[' || 'ab'::char(4)::text || ']';

SELECT x::char(2), length(x::char(10)) FROM (VALUES ('hello'), ('hi  '), (NULL)) t(x) ORDER BY 1;
