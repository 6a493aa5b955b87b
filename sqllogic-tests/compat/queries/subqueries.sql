-- Subqueries: scalar (correlated or not), IN, NOT IN, EXISTS, ANY/ALL, derived tables,
-- CTEs (WITH, WITH RECURSIVE) and the set operations UNION [ALL], INTERSECT, EXCEPT.

SELECT id FROM payments WHERE amount > (SELECT avg(amount) FROM payments);

SELECT id, (SELECT count(*) FROM payments q WHERE q.card = p.card) AS n FROM payments p WHERE id <= 6 ORDER BY id;

SELECT id FROM payments WHERE card IN (SELECT card FROM card_totals WHERE n >= 9);

SELECT id FROM payments WHERE card NOT IN (SELECT card FROM card_totals WHERE n > 5);

-- NOT IN a subquery that yields a NULL is never true
SELECT id FROM payments WHERE qty NOT IN (SELECT qty FROM payments WHERE card = 'c-2');

SELECT id FROM payments p WHERE EXISTS (SELECT 1 FROM payments q WHERE q.card = p.card AND q.amount > 200);

-- each card's first payment
SELECT id, card FROM payments p WHERE NOT EXISTS (SELECT 1 FROM payments q WHERE q.card = p.card AND q.ts < p.ts);

SELECT card, (SELECT max(amount) FROM payments q WHERE q.card = c.card) FROM card_totals c ORDER BY card;

SELECT * FROM (SELECT card, sum(qty) AS q FROM payments GROUP BY card) s WHERE q > 10 ORDER BY card;

WITH big AS (SELECT * FROM payments WHERE amount > 100) SELECT id, card FROM big ORDER BY id;

WITH per_card AS (SELECT card, count(*) AS n FROM payments GROUP BY card), ranked AS (SELECT card, n, rank() OVER (ORDER BY n DESC) AS r FROM per_card) SELECT * FROM ranked WHERE r <= 2 ORDER BY r, card;

WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t WHERE n < 5) SELECT n FROM t;

WITH RECURSIVE days(d) AS (SELECT DATE '2026-10-24' UNION ALL SELECT d + 1 FROM days WHERE d < DATE '2026-10-28') SELECT d, (SELECT count(*) FROM payments WHERE ts::date = d) FROM days ORDER BY d;

SELECT card FROM payments WHERE amount > 100 UNION SELECT card FROM payments WHERE qty > 5;

SELECT card FROM payments WHERE amount > 100 UNION ALL SELECT card FROM payments WHERE qty > 5;

SELECT card FROM payments WHERE amount > 100 INTERSECT SELECT card FROM payments WHERE qty > 5;

SELECT card FROM payments EXCEPT SELECT card FROM payments WHERE amount > 100;

SELECT merchant FROM payments WHERE card = 'c-1' INTERSECT ALL SELECT merchant FROM payments WHERE card = 'c-2';

SELECT merchant FROM payments WHERE card = 'c-1' EXCEPT ALL SELECT merchant FROM payments WHERE card = 'c-2';

-- ORDER BY applies to the whole UNION
SELECT id FROM payments WHERE id < 3 UNION SELECT id FROM payments WHERE id > 48 ORDER BY id DESC;

SELECT 1 AS x UNION SELECT 2 UNION SELECT 1;

SELECT id FROM payments WHERE amount = (SELECT max(amount) FROM payments);

SELECT id FROM payments WHERE amount > ALL (SELECT amount FROM payments WHERE card = 'c-2');

SELECT id FROM payments WHERE amount < ANY (SELECT amount FROM payments WHERE card = 'c-5' AND amount < 1);

SELECT (SELECT card FROM payments WHERE id = 3) AS c, (SELECT count(*) FROM card_totals) AS metrics;

-- a scalar subquery without rows is NULL
SELECT (SELECT amount FROM payments WHERE id = 999) AS missing;

SELECT id FROM payments p WHERE amount = (SELECT max(amount) FROM payments q WHERE q.card = p.card) ORDER BY id;

SELECT card, n FROM card_totals WHERE n > (SELECT avg(n) FROM card_totals) ORDER BY card;

SELECT count(*) FROM (SELECT DISTINCT card, merchant FROM payments) d;

SELECT merchant, total FROM (SELECT merchant, sum(qty) AS total FROM payments GROUP BY merchant) s ORDER BY total DESC NULLS LAST, merchant;

-- a row constructor IN a subquery
SELECT id FROM payments WHERE (card, merchant) IN (SELECT card, merchant FROM payments WHERE amount > 200) ORDER BY id;

WITH last AS (SELECT card, max(ts) AS ts FROM payments GROUP BY card) SELECT p.card, p.id FROM payments p JOIN last ON last.card = p.card AND last.ts = p.ts ORDER BY p.card;

SELECT card FROM card_totals WHERE total > 400 UNION SELECT card FROM card_stats WHERE merchants < 5 ORDER BY card;

SELECT id, amount FROM payments WHERE id IN (SELECT id FROM payments ORDER BY amount DESC NULLS LAST, id LIMIT 3) ORDER BY amount;

-- A recursive CTE counting with an integer.
WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t WHERE n < 5) SELECT n FROM t ORDER BY n;

-- A cast to numeric inside a subquery: the literal's own scale, PostgreSQL's / and %,
-- rounding casts to integers, ceil and floor of scale 0, and a float reads it as a float.
SELECT v, v % 1, mod(v, 1), v / 3, ceil(v), floor(v), v::int FROM (SELECT 2.55::numeric AS v) s;

SELECT v + 1, v * 2, (-v)::int, v > 2.5, v * 2.5::float8 FROM (SELECT 2.50::numeric AS v) s;

WITH c AS (SELECT 1.5::numeric AS x, 4::numeric AS y) SELECT x / y, y % x, x * y FROM c;

-- Everyday queries, run against both servers in stop 101.
SELECT card FROM payments EXCEPT SELECT card FROM payments WHERE amount > 100 ORDER BY 1;

SELECT card FROM payments INTERSECT SELECT card FROM payments WHERE qty > 3 ORDER BY 1;

-- More everyday queries (stop 101).
SELECT count(*) FROM payments WHERE amount > ALL (SELECT amount FROM payments WHERE card = 'c1');

SELECT id FROM payments p WHERE EXISTS (SELECT 1 FROM payments q WHERE q.card = p.card AND q.id > p.id + 20) ORDER BY id;

SELECT id FROM payments WHERE id NOT IN (SELECT qty FROM payments WHERE qty IS NOT NULL) ORDER BY id LIMIT 5;

SELECT id FROM payments WHERE id NOT IN (SELECT qty FROM payments) ORDER BY id LIMIT 5;

SELECT (SELECT count(*) FROM payments q WHERE q.card = p.card) AS n, p.id FROM payments p ORDER BY p.id LIMIT 4;

-- [NOT] EXISTS as a value in the select list: uncorrelated, correlated, around a grouped subquery.
SELECT EXISTS (SELECT 1 FROM payments WHERE amount > 1000), NOT EXISTS (SELECT 1 FROM payments WHERE amount > 1e7);

SELECT p.id, EXISTS (SELECT 1 FROM payments q WHERE q.card = p.card AND q.amount > 100) AS big FROM payments p ORDER BY p.id LIMIT 6;

SELECT EXISTS (SELECT card FROM payments GROUP BY card HAVING count(*) > 3), EXISTS (SELECT max(amount) FROM payments WHERE amount < 0);
