-- Joins: inner, left, right, full, cross, self, USING, NATURAL, LATERAL, the comma form,
-- and joins between the stream and its metrics (views in PostgreSQL).

SELECT p.id, c.n FROM payments p JOIN card_totals c ON c.card = p.card WHERE p.id <= 5 ORDER BY p.id;

SELECT p.id, c.n, c.total FROM payments p INNER JOIN card_totals c USING (card) ORDER BY p.id LIMIT 10;

SELECT card, n, merchants FROM card_totals JOIN card_stats USING (card) ORDER BY card;

-- USING shows the join column once, first
SELECT * FROM card_totals JOIN card_stats USING (card) ORDER BY card;

SELECT a.id, b.id FROM payments a JOIN payments b ON a.card = b.card AND a.id < b.id WHERE a.card = 'C-6' ORDER BY a.id, b.id;

SELECT a.id, b.id FROM payments a JOIN payments b ON a.amount = b.amount AND a.id < b.id ORDER BY 1, 2;

SELECT m.merchant, p.id FROM merchant_totals m LEFT JOIN payments p ON p.merchant = m.merchant AND p.amount > 100 ORDER BY m.merchant NULLS LAST, p.id;

SELECT p.id, t.label FROM payments p LEFT JOIN (VALUES ('c-1', 'gold'), ('c-2', 'silver'), ('c-99', 'none')) AS t(card, label) ON t.card = p.card WHERE p.id <= 8 ORDER BY p.id;

SELECT t.card, p.id FROM (VALUES ('c-1'), ('c-99')) AS t(card) LEFT JOIN payments p ON p.card = t.card AND p.id < 10 ORDER BY t.card, p.id;

SELECT p.id, t.card FROM payments p RIGHT JOIN (VALUES ('c-5'), ('c-99')) AS t(card) ON p.card = t.card ORDER BY t.card, p.id;

SELECT coalesce(p.card, t.card) AS card, p.id, t.label FROM (SELECT * FROM payments WHERE id <= 3) p FULL JOIN (VALUES ('c-2', 'x'), ('c-77', 'y')) AS t(card, label) ON p.card = t.card ORDER BY 1, 2;

SELECT count(*) FROM payments CROSS JOIN card_totals;

SELECT c.card, m.merchant FROM card_totals c CROSS JOIN (SELECT merchant FROM merchant_totals WHERE merchant LIKE 'B%') m ORDER BY 1, 2;

-- payments above their card's mean
SELECT p.card, count(*) FROM payments p JOIN card_totals c ON p.card = c.card AND p.amount > c.total / c.n GROUP BY p.card ORDER BY p.card;

SELECT m.merchant, m.n, count(p.id) FROM merchant_totals m JOIN payments p ON p.merchant = m.merchant GROUP BY m.merchant, m.n ORDER BY m.merchant;

-- NATURAL joins on every column of the same name (id, card and qty)
SELECT id, card, q.qty FROM payments NATURAL JOIN (SELECT id, card, qty FROM payments WHERE qty > 5) q ORDER BY id;

SELECT * FROM (VALUES (1), (2)) AS a(x) CROSS JOIN (VALUES ('a'), ('b')) AS b(y);

SELECT p.id, c.n FROM payments p, card_totals c WHERE p.card = c.card AND p.id IN (1, 2, 3) ORDER BY p.id;

SELECT c.card, l.id, l.amount FROM card_totals c CROSS JOIN LATERAL (SELECT id, amount FROM payments p WHERE p.card = c.card ORDER BY amount DESC NULLS LAST, id LIMIT 1) l ORDER BY c.card;

SELECT p.id, c.n, m.n FROM payments p JOIN card_totals c ON c.card = p.card JOIN merchant_totals m ON m.merchant = p.merchant WHERE p.id BETWEEN 10 AND 20 ORDER BY p.id;

SELECT ct.card, ct.total, cs.first_ts FROM card_totals ct LEFT JOIN card_stats cs ON cs.card = ct.card ORDER BY ct.card;

-- NULL keys never match
SELECT p.id, p.merchant, m.n FROM payments p LEFT JOIN merchant_totals m ON m.merchant = p.merchant WHERE p.merchant IS NULL ORDER BY p.id;

-- the metric grouped by merchant has a group for NULL
SELECT merchant, n, n_qty, qty FROM merchant_totals WHERE merchant IS NULL;

SELECT a.id AS earlier, b.id AS later FROM payments a JOIN payments b ON b.card = a.card AND b.ts > a.ts AND b.ts < a.ts + INTERVAL '1 day' ORDER BY 1, 2;

SELECT c.card, count(p.id) FROM card_totals c LEFT JOIN payments p ON p.card = c.card AND p.amount > 1000 GROUP BY c.card ORDER BY c.card;

SELECT p.id, x.card FROM payments p FULL OUTER JOIN (SELECT card FROM card_totals WHERE n < 5) x ON x.card = p.card WHERE p.id < 3 OR p.id IS NULL ORDER BY p.id;

-- More everyday queries (stop 101).
SELECT p.id, q.id FROM payments p LEFT JOIN payments q ON q.id = p.id + 100 ORDER BY p.id LIMIT 3;

SELECT a.card, count(*) FROM payments a JOIN card_totals t USING (card) GROUP BY a.card ORDER BY a.card LIMIT 3;
