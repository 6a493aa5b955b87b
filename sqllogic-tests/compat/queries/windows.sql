-- Window functions: ranking, offsets, frames (ROWS, RANGE, GROUPS), named windows, and
-- windows over grouped rows. Every window's ORDER BY is total unless the query is about
-- peers, and every query orders its output.

SELECT id, card, row_number() OVER (PARTITION BY card ORDER BY ts, id) AS rn FROM payments ORDER BY id;

-- rank leaves gaps after ties, dense_rank does not
SELECT id, amount, rank() OVER (ORDER BY amount DESC NULLS LAST) AS r FROM payments ORDER BY r, id;

SELECT id, amount, dense_rank() OVER (ORDER BY amount) AS dr FROM payments WHERE amount IS NOT NULL ORDER BY dr, id;

SELECT id, card, amount, lag(amount) OVER (PARTITION BY card ORDER BY ts, id) AS prev FROM payments ORDER BY card, ts, id;

SELECT id, lead(amount, 2, 0) OVER (ORDER BY id) FROM payments WHERE id <= 10 ORDER BY id;

SELECT id, card, first_value(id) OVER (PARTITION BY card ORDER BY ts, id) AS first_id FROM payments ORDER BY id;

SELECT id, last_value(id) OVER (PARTITION BY card ORDER BY ts, id ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) FROM payments ORDER BY id;

-- the default frame ends at the current row
SELECT id, last_value(id) OVER (PARTITION BY card ORDER BY ts, id) FROM payments WHERE card = 'c-4' ORDER BY id;

SELECT id, card, qty, sum(qty) OVER (PARTITION BY card ORDER BY ts, id ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS running FROM payments ORDER BY card, ts, id;

SELECT id, sum(qty) OVER (ORDER BY id ROWS BETWEEN 1 PRECEDING AND 1 FOLLOWING) FROM payments ORDER BY id;

SELECT id, count(*) OVER (PARTITION BY card) AS per_card FROM payments ORDER BY id;

SELECT id, ntile(4) OVER (ORDER BY id) FROM payments ORDER BY id;

SELECT id, ntile(3) OVER (PARTITION BY card ORDER BY id) FROM payments WHERE card IN ('c-1', 'C-6') ORDER BY id;

SELECT id, card, avg(amount) OVER (PARTITION BY card) AS card_avg FROM payments WHERE card IN ('c-2', 'c-4') ORDER BY id;

SELECT id, percent_rank() OVER (ORDER BY id), cume_dist() OVER (ORDER BY id) FROM payments WHERE id <= 8 ORDER BY id;

-- the largest payment of each card
SELECT card, id, amount FROM (SELECT card, id, amount, row_number() OVER (PARTITION BY card ORDER BY amount DESC NULLS LAST, id) AS rn FROM payments) t WHERE rn = 1 ORDER BY card;

-- RANGE mode (the default) sums all peers of the current row
SELECT id, qty, sum(qty) OVER (ORDER BY qty) FROM payments WHERE qty < 100 ORDER BY id;

SELECT id, max(amount) OVER w, min(amount) OVER w FROM payments WINDOW w AS (PARTITION BY card) ORDER BY id;

SELECT id, nth_value(id, 2) OVER (PARTITION BY card ORDER BY ts, id ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) FROM payments ORDER BY id;

-- the gap between a card's consecutive payments, as an interval
SELECT id, ts - lag(ts) OVER (PARTITION BY card ORDER BY ts, id) AS gap FROM payments ORDER BY id;

SELECT id, lag(id, 1, -1) OVER (ORDER BY ts, id), lead(id) OVER (ORDER BY ts, id) FROM payments ORDER BY ts, id;

SELECT card, count(*), rank() OVER (ORDER BY count(*) DESC) FROM payments GROUP BY card ORDER BY 3, card;

SELECT id, ts, count(*) OVER (PARTITION BY card ORDER BY ts RANGE BETWEEN INTERVAL '1 day' PRECEDING AND CURRENT ROW) FROM payments WHERE card = 'c-1' ORDER BY id;

SELECT id, qty, count(*) OVER (ORDER BY qty GROUPS BETWEEN 1 PRECEDING AND CURRENT ROW) FROM payments WHERE qty < 100 ORDER BY id;

SELECT id, qty, sum(qty) OVER (ORDER BY id ROWS 2 PRECEDING) FROM payments WHERE id <= 12 ORDER BY id;

SELECT id, string_agg(card, ',') OVER (ORDER BY id ROWS BETWEEN 2 PRECEDING AND CURRENT ROW EXCLUDE CURRENT ROW) FROM payments WHERE id <= 8 ORDER BY id;

SELECT id, amount, amount - avg(amount) OVER (PARTITION BY card) AS diff FROM payments WHERE card = 'c-5' ORDER BY id;

SELECT id, row_number() OVER (ORDER BY amount DESC NULLS LAST, id) AS rn, rank() OVER (ORDER BY card) AS card_rank FROM payments WHERE id <= 10 ORDER BY id;

SELECT card, id, sum(amount) OVER (PARTITION BY card ORDER BY ts, id) AS running FROM payments WHERE card IN ('c-3', 'c-10') ORDER BY card, ts, id;

SELECT DISTINCT card, count(*) OVER (PARTITION BY card) FROM payments ORDER BY card;

-- Everyday queries, run against both servers in stop 101.
SELECT card, amount, lag(amount) OVER (PARTITION BY card ORDER BY ts) FROM payments ORDER BY card, ts LIMIT 6;

SELECT card, sum(amount) OVER (ORDER BY id ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) FROM payments ORDER BY id LIMIT 5;

SELECT ntile(3) OVER (ORDER BY id), percent_rank() OVER (ORDER BY amount), cume_dist() OVER (ORDER BY amount) FROM payments ORDER BY id LIMIT 5;

-- More everyday queries (stop 101).
SELECT id, first_value(id) OVER w, last_value(id) OVER w, nth_value(id, 2) OVER w FROM payments WINDOW w AS (PARTITION BY card ORDER BY id ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) ORDER BY id LIMIT 5;

SELECT id, rank() OVER (ORDER BY card), dense_rank() OVER (ORDER BY card), row_number() OVER (ORDER BY card, id) FROM payments ORDER BY id LIMIT 6;

SELECT id, avg(amount) OVER (PARTITION BY card) FROM payments ORDER BY id LIMIT 5;

SELECT id, count(*) OVER (ORDER BY ts RANGE BETWEEN interval '1 hour' PRECEDING AND CURRENT ROW) FROM payments ORDER BY id LIMIT 5;

-- Queries over the metrics and the stream as a service would run them (stop 101).
SELECT card, amount, amount - avg(amount) OVER (PARTITION BY card) AS diff FROM payments WHERE card = 'c1' ORDER BY id;

SELECT id, amount, sum(amount) OVER (PARTITION BY card ORDER BY ts ROWS UNBOUNDED PRECEDING) FROM payments WHERE card IN ('c1', 'c2') ORDER BY card, ts;

SELECT id, lead(amount, 2, 0) OVER (ORDER BY id), lag(card) OVER (ORDER BY id) FROM payments ORDER BY id LIMIT 4;

SELECT count(*) OVER (), id FROM payments ORDER BY id LIMIT 2;
