-- Filters: comparisons, BETWEEN, IN, IS [NOT] NULL, IS [NOT] DISTINCT FROM, boolean logic
-- with NULLs (three-valued), comparisons across numeric types and with timestamps.

SELECT id, amount FROM payments WHERE amount > 100;

SELECT id FROM payments WHERE amount >= 12.5 AND amount <= 19.99;

SELECT id FROM payments WHERE amount BETWEEN 10 AND 20;

SELECT id FROM payments WHERE amount NOT BETWEEN 1 AND 1000;

-- BETWEEN SYMMETRIC accepts the bounds in either order
SELECT id FROM payments WHERE amount BETWEEN SYMMETRIC 20 AND 10;

SELECT id FROM payments WHERE card = 'c-1';

SELECT id FROM payments WHERE card <> 'c-1' AND card != 'c-2';

SELECT id FROM payments WHERE card IN ('c-3', 'C-6');

SELECT id FROM payments WHERE card NOT IN ('c-1', 'c-2', 'c-3');

SELECT id FROM payments WHERE merchant IS NULL;

SELECT id FROM payments WHERE merchant IS NOT NULL AND qty IS NULL;

-- NOT IN a list holding NULL is never true
SELECT id FROM payments WHERE merchant NOT IN ('Bakery', NULL);

-- = NULL is never true
SELECT id FROM payments WHERE merchant = NULL;

SELECT id FROM payments WHERE qty IS DISTINCT FROM 1;

SELECT id FROM payments WHERE qty IS NOT DISTINCT FROM NULL;

SELECT id FROM payments WHERE amount > 100 OR qty > 5;

-- NOT of NULL is NULL: rows without amount are not returned
SELECT id FROM payments WHERE NOT (amount > 10);

SELECT id FROM payments WHERE ts >= '2026-10-26' AND ts < '2026-10-27';

SELECT id FROM payments WHERE ts > TIMESTAMP '2026-10-31 12:00';

SELECT id FROM payments WHERE ts::date = DATE '2026-10-25';

SELECT id FROM payments WHERE id % 10 = 0;

SELECT id FROM payments WHERE amount = 0.1;

SELECT id FROM payments WHERE amount = 1e6;

SELECT id FROM payments WHERE amount * qty > 100;

SELECT id FROM payments WHERE (card = 'c-1' OR card = 'c-2') AND amount < 10;

-- text comparison by code point in a C.UTF-8 database: upper case sorts before lower case
SELECT id, merchant FROM payments WHERE merchant > 'B' AND merchant < 'c';

-- an integer column compared with a numeric literal
SELECT id FROM payments WHERE qty > 2.5;

SELECT id FROM payments WHERE coalesce(qty, 0) = 0;

SELECT id FROM payments WHERE TRUE AND id < 3;

SELECT id FROM payments WHERE false;

SELECT id FROM payments WHERE id = ANY (ARRAY[1, 2, 3]);

SELECT id FROM payments WHERE ts BETWEEN '2026-10-25 00:00' AND '2026-10-25 02:00';

SELECT id FROM payments WHERE note IS NULL AND merchant = 'Bakery';

SELECT id FROM payments WHERE amount IN (12.5, 4.5);

SELECT id FROM payments WHERE (amount > 100) IS NOT TRUE;

SELECT id FROM payments WHERE (qty > 5) IS UNKNOWN;

-- Everyday queries, run against both servers in stop 101.
SELECT id FROM payments WHERE note LIKE '%a%' OR note ILIKE 'B%' ORDER BY id;

SELECT id FROM payments WHERE card IN ('c1', 'c2') AND amount BETWEEN 10 AND 100 ORDER BY id;
