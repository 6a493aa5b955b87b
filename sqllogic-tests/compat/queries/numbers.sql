-- Numbers: integer overflow (22003), division by zero for integers, numerics and floats
-- (22012), integer division and modulo signs, numeric literals and their scale, rounding
-- functions on numeric (half away from zero) and float (half to even), power, sqrt,
-- width_bucket, and how float4 and float8 values are printed.

SELECT 2147483647 + 1;

SELECT 9223372036854775807 + 1;

SELECT (-2147483648)::int, -2147483647 - 1;

SELECT qty + qty FROM payments WHERE id = 24;

SELECT qty * 2 FROM payments WHERE id = 24;

SELECT 1 / 0;

SELECT 1.0 / 0;

SELECT 1.0::float8 / 0;

SELECT amount / 0 FROM payments WHERE id = 1;

SELECT qty / 0 FROM payments WHERE id = 1;

SELECT 5 % 0;

-- integer division truncates toward zero; % takes the dividend's sign
SELECT 7 / 2, -7 / 2, 7 % 3, -7 % 3;

SELECT 7.0 / 2, 7 / 2.0, 10 / 4, 10::float8 / 4;

SELECT 1 / 3.0, 2.0 / 3;

SELECT 0.1 + 0.2, 0.1 + 0.2 = 0.3;

SELECT 0.1::float8 + 0.2::float8, 0.1::float8 + 0.2::float8 = 0.3::float8;

SELECT 1e6, 1.5e3, 2.50, 1.0e-3, .5;

SELECT round(2.5), round(-2.5), round(3.14159, 2), round(1234.5, -2);

SELECT round(2.5::float8), round(3.5::float8), round(-2.5::float8);

SELECT trunc(3.789, 1), trunc(-3.7), trunc(3.7::float8);

SELECT ceil(3.2), ceiling(-3.2), floor(3.8), floor(-3.2);

SELECT id, ceil(amount), floor(amount), round(amount) FROM payments WHERE id IN (3, 9, 15, 22) ORDER BY id;

SELECT abs(-17), abs(-1.5), abs(amount) FROM payments WHERE id = 15;

SELECT mod(17, 5), mod(-17, 5), mod(17.5, 5);

SELECT power(2, 10), power(2.0, 0.5), 2 ^ 10, 2.0 ^ 3;

SELECT sqrt(16), sqrt(2), sqrt(2.0);

SELECT sqrt(-1);

SELECT width_bucket(5.35, 0.024, 10.06, 5);

SELECT id, width_bucket(amount, 0, 500, 5) AS bucket FROM payments WHERE amount IS NOT NULL ORDER BY id;

SELECT 1e-7::float8, 123456.789::real, 1e20::real, 12345678.9::float4;

SELECT 100000::real, 1000000::real, 0.000123::real, 1.5::real * 3;

SELECT 'NaN'::float8 = 'NaN'::float8, 'NaN'::float8 > 1e308::float8;

SELECT factorial(5), gcd(12, 18), lcm(4, 6);

SELECT sign(-3.5), sign(0), sign(2::float8);

SELECT exp(1.0), ln(10), log(100), log(2, 8);

SELECT pi(), degrees(pi()), radians(180);

SELECT 1 + 2 * 3 - 4 / 2, (1 + 2) * 3, -2 ^ 2;

SELECT 255 & 15, 1 << 4, 5 | 2, 5 # 3, ~5;

SELECT sum(amount) FROM payments WHERE id IN (7, 8);

SELECT amount * 3, amount + 0.2 FROM payments WHERE id = 7;

SELECT qty::numeric / 3 FROM payments WHERE id = 4;

SELECT id, round(amount::numeric, 1) FROM payments WHERE id IN (9, 22) ORDER BY id;

-- round(double precision, integer) does not exist
SELECT round(amount, 1) FROM payments WHERE id = 9;

SELECT 1e308::float8 * 10;

SELECT 0.1::numeric(3,2) * 3, 2.675::numeric(10,2);

SELECT 9223372036854775807, -9223372036854775808, 9223372036854775808;

SELECT 4611686018427387904 * 2;

SELECT amount FROM payments WHERE id = 12;

SELECT cbrt(27::float8), 2 ^ 0.5;

-- |/, ||/ and @: square root, cube root, absolute value.
SELECT |/ 16.0, ||/ 27.0, @ -5, @ -2.5;

-- Everyday queries, run against both servers in stop 101.
SELECT qty / 2, qty % 3, -qty / 2, qty::float8 / 2 FROM payments WHERE qty IS NOT NULL ORDER BY id LIMIT 5;

SELECT 7 / 2, 7.0 / 2, -7 / 2, 7 % -3, -7 % 3, 2 ^ 10, 10 / 4 * 4;

SELECT abs(-5), sign(-2.5), mod(-7, 3), gcd(12, 18), lcm(4, 6), factorial(5);

SELECT round(2.345, 2), round(-2.5), trunc(2.789, 1), ceil(-0.5), floor(-0.5);

SELECT 10::float8 / 3, 1e-7::float8, 1.5e300::float8 * 1e8, 'Infinity'::float8, '-inf'::float8 < 0;

-- More everyday queries (stop 101).
SELECT 1.0::float8 / 3, 100.0::float8 * 1.1, 0.1::float8 + 0.2::float8, 1e16::float8 + 1;

SELECT round(1.005::float8 * 100), sqrt(2::float8), pi(), degrees(pi()), sin(0), atan2(1, 1);

SELECT log(100), log10(1000), ln(exp(1)), exp(0), power(2, 0.5), 2 ^ -1;

-- to_char of numbers: places, groups, signs, fill mode, rounding and overflow.
SELECT to_char(amount, 'FM999,990.00'), to_char(amount, '9999999.9'), to_char(qty, 'S000'), to_char(-amount, '99999PR') FROM payments ORDER BY id LIMIT 6;

SELECT to_char(sum(amount), 'FM9,999,999.00'), to_char(avg(qty), '990.999') FROM payments;

-- div: the integer quotient of numerics, truncated toward zero.
SELECT div(9, 4), div(-7, 2), div(9.5, 2), div(123456789012345678901234567890, 7), pg_typeof(div(9, 4));

SELECT div(1, 0);
