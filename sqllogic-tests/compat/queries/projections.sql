-- Projections: SELECT lists, aliases, expressions, DISTINCT, VALUES, and the metrics as
-- relations. Column names are compared too: PostgreSQL names an expression after its
-- function or cast ("abs", "ts", "coalesce") or "?column?".

-- every column of every row
SELECT * FROM payments ORDER BY id;

SELECT id, card, amount FROM payments WHERE id <= 5;

-- quoted aliases keep their case and spaces
SELECT id AS "Payment Id", card AS c FROM payments WHERE id < 4 ORDER BY id;

SELECT id, amount * 2 AS double_amount, amount + qty AS total FROM payments WHERE id BETWEEN 1 AND 8 ORDER BY id;

-- unnamed expressions are named ?column?
SELECT id, qty * 2, qty / 3, qty % 3 FROM payments WHERE qty IS NOT NULL AND id <= 10 ORDER BY id;

SELECT 1;

SELECT 1 AS one, 'two' AS two, 3.0 AS three, NULL AS four;

SELECT DISTINCT card FROM payments;

-- NULL sorts last in ascending order
SELECT DISTINCT merchant FROM payments ORDER BY merchant;

SELECT DISTINCT ON (card) card, id, amount FROM payments ORDER BY card, id;

-- || with a NULL operand is NULL
SELECT id, card || '/' || merchant AS label FROM payments WHERE id <= 10 ORDER BY id;

SELECT id, CASE WHEN amount > 100 THEN 'large' WHEN amount > 10 THEN 'medium' ELSE 'small' END AS size FROM payments ORDER BY id;

-- an unnamed CASE is named "case"
SELECT id, CASE card WHEN 'c-1' THEN 'one' WHEN 'c-2' THEN 'two' END FROM payments WHERE id <= 6 ORDER BY id;

SELECT id, coalesce(merchant, 'unknown') AS merchant, coalesce(qty, 0) AS qty FROM payments WHERE id BETWEEN 5 AND 16 ORDER BY id;

-- unnamed function calls are named after the function
SELECT id, nullif(qty, 1), coalesce(note, '-') FROM payments WHERE id <= 10 ORDER BY id;

SELECT id, greatest(amount, 10) AS g, least(amount, 10) AS l FROM payments WHERE id <= 12 ORDER BY id;

SELECT payments.id, payments.card FROM payments WHERE payments.id = 3;

SELECT p.* FROM payments AS p WHERE p.id = 7;

SELECT id, amount IS NULL AS no_amount, merchant IS NOT NULL AS has_merchant FROM payments WHERE id IN (7, 16, 45) ORDER BY id;

SELECT id, -amount AS neg, abs(amount) FROM payments WHERE id IN (15, 19) ORDER BY id;

-- a cast keeps the column's name
SELECT id, ts, ts::date, amount::int FROM payments WHERE id IN (3, 19, 50) ORDER BY id;

-- booleans print as t and f
SELECT id, amount > 50 AS big FROM payments WHERE id <= 6 ORDER BY id;

SELECT TRUE, FALSE, NULL::boolean;

SELECT id, qty, qty IS DISTINCT FROM 1 AS not_one FROM payments WHERE id IN (5, 6, 7) ORDER BY id;

SELECT 'literal' AS col, id FROM payments WHERE id = 1;

VALUES (1, 'a'), (2, 'b');

SELECT * FROM (VALUES (1, 'a'), (2, 'b')) AS t(x, y) ORDER BY x;

-- the metrics, read as relations
SELECT * FROM card_totals ORDER BY card;

SELECT * FROM merchant_totals ORDER BY merchant;

SELECT * FROM card_stats ORDER BY card;

SELECT card, n FROM card_totals WHERE card = 'c-1';

SELECT card, total / n AS mean FROM card_totals WHERE card IN ('c-1', 'c-4');

-- Everyday queries, run against both servers in stop 101.
SELECT nullif(qty, 2), coalesce(note, '-'), greatest(qty, 3), least(amount, 50) FROM payments ORDER BY id LIMIT 5;

SELECT id, CASE WHEN amount > 100 THEN 'big' WHEN amount > 10 THEN 'mid' ELSE 'small' END FROM payments ORDER BY id LIMIT 6;

SELECT ARRAY[1,2] || 3, array_length(ARRAY[1,2,3], 1), cardinality(ARRAY[[1,2],[3,4]]), (ARRAY[1,2,3])[2];

-- More everyday queries (stop 101).
SELECT NULL = NULL, NULL IS NULL, NULL IS DISTINCT FROM 1, 1 IS NOT DISTINCT FROM 1, NULL::int + 1;

SELECT array_to_string(ARRAY['a', NULL, 'c'], ',', '*'), string_to_array('a,b,,c', ','), array_position(ARRAY[5,6,7], 6), ARRAY[1,2,3] @> ARRAY[2];

-- Queries over the metrics and the stream as a service would run them (stop 101).
SELECT card, n, total FROM card_totals WHERE total > 100 ORDER BY total DESC, card LIMIT 3;

SELECT t.card, t.n, s.merchants FROM card_totals t JOIN card_stats s ON s.card = t.card ORDER BY t.card LIMIT 4;

SELECT merchant, n, avg_amount FROM merchant_totals ORDER BY merchant NULLS FIRST;

SELECT count(*), sum(n) FROM card_totals;

SELECT card, last_ts - first_ts AS span FROM card_stats ORDER BY span DESC, card LIMIT 3;

SELECT card, ts, amount FROM payments WHERE (card, ts) > ('c3', timestamp '2026-10-25 00:00') ORDER BY card, ts LIMIT 3;

SELECT CASE card WHEN 'c1' THEN 1 WHEN 'c2' THEN 2 END, count(*) FROM payments GROUP BY 1 ORDER BY 1 NULLS LAST;

SELECT id, amount::int, amount::bigint, amount::real, amount::numeric(8,1) FROM payments ORDER BY id LIMIT 4;

SELECT sum(qty)::float8 / count(*), sum(qty) / count(*), sum(qty) * 1.0 / count(*) FROM payments;

SELECT max(length(note)), min(note), max(note) FROM payments;

SELECT note, count(*) FROM payments GROUP BY note ORDER BY count(*) DESC, note NULLS FIRST LIMIT 3;

SELECT left(card, 1) || '-' || right(card, 1), lower(merchant) = 'acme' FROM payments ORDER BY id LIMIT 3;
