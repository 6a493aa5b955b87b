-- Errors: each query fails in PostgreSQL, and only the SQLSTATE is compared (the message
-- text is not). The session goes on after each.

-- undefined column
SELECT nosuch FROM payments;

-- undefined table
SELECT id FROM nosuch_table;

-- undefined function
SELECT nosuch_fn(1);

-- ambiguous column
SELECT card FROM payments p JOIN card_totals c ON c.card = p.card;

-- a plain column outside GROUP BY
SELECT card, count(*) FROM payments;

SELECT card, amount FROM payments GROUP BY card;

-- a scalar subquery with more than one row
SELECT (SELECT id FROM payments);

SELECT id FROM payments WHERE amount = (SELECT amount FROM payments WHERE card = 'c-1');

-- invalid datetime syntax
SELECT 'garbage'::timestamp;

-- datetime field out of range
SELECT '2026-10-32 10:00'::timestamp;

-- text = integer: no such operator
SELECT id FROM payments WHERE card = 1;

-- the literal is read as the column's type and is not a number
SELECT id FROM payments WHERE id = 'abc';

-- syntax errors
SELECT * FORM payments;

SELECT id FROM payments WHERE;

SELECT 1 +;

SELECT id, FROM payments;

SELECT id FROM payments ORDER BY nosuch;

SELECT count(*) FROM payments GROUP BY nosuch;

SELECT sum(card) FROM payments;

SELECT avg(ts) FROM payments;

SELECT amount + card FROM payments;

-- a WHERE that is not boolean
SELECT id FROM payments WHERE amount;

SELECT count(*) FROM payments HAVING amount > 1;

SELECT id FROM payments LIMIT -1;

SELECT id FROM payments OFFSET -1;

-- a window function without OVER
SELECT row_number() FROM payments;

SELECT sum(count(*)) FROM payments;

SELECT id FROM payments WHERE sum(amount) > 1;

SELECT id FROM payments WHERE id IN (SELECT id, card FROM payments);

SELECT 1 UNION SELECT 1, 2;

SELECT card FROM payments UNION SELECT id FROM payments;

-- unquoted names are folded to lower case; quoted ones are not
SELECT "ID" FROM payments;

SELECT id FROM payments p WHERE payments.id = 1;

SELECT CAST(amount AS nosuchtype) FROM payments;

SELECT substr(card) FROM payments;

SELECT id FROM payments WHERE ts > 'soon';

SELECT * FROM card_totals WHERE nosuch > 1;

SELECT 1 / (qty - qty) FROM payments WHERE id = 1;

SELECT id FROM payments GROUP BY id HAVING card = 'c-1';

SELECT lag(amount) OVER (ORDER BY nosuch) FROM payments;

-- More everyday queries (stop 101).
SELECT 2147483647 + 1;

SELECT 9223372036854775807::bigint + 1;

SELECT (-32768)::smallint - 1::smallint;

SELECT 5 / 0;

SELECT 5.0 / 0;

SELECT 'abc'::int;

SELECT '2026-13-01'::date;
