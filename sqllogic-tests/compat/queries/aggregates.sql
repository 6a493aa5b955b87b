-- Grouping and aggregates: result values and types as PostgreSQL prints them (sum of an
-- integer column is a bigint, avg of one a numeric), DISTINCT, FILTER, HAVING, ordered-set
-- aggregates, string_agg and array_agg with ORDER BY, and empty inputs.

SELECT count(*) FROM payments;

SELECT count(*), count(merchant), count(amount), count(qty), count(note) FROM payments;

SELECT count(DISTINCT card), count(DISTINCT merchant) FROM payments;

SELECT sum(qty), min(qty), max(qty) FROM payments;

SELECT sum(amount) FROM payments;

SELECT min(amount), max(amount) FROM payments;

-- avg of an integer column is a numeric with PostgreSQL's scale
SELECT avg(qty) FROM payments;

SELECT avg(qty) FROM payments WHERE qty < 100;

SELECT avg(amount) FROM payments WHERE card = 'c-3';

SELECT card, count(*), sum(qty) FROM payments GROUP BY card;

SELECT card, count(*) AS n FROM payments GROUP BY card HAVING count(*) > 7 ORDER BY card;

SELECT merchant, count(*) FROM payments GROUP BY merchant ORDER BY merchant;

SELECT min(ts), max(ts) FROM payments;

SELECT min(card), max(card), min(merchant), max(merchant) FROM payments;

SELECT string_agg(card, ',' ORDER BY card) FROM (SELECT DISTINCT card FROM payments) s;

SELECT merchant, string_agg(DISTINCT card, ';' ORDER BY card) FROM payments WHERE merchant IS NOT NULL GROUP BY merchant ORDER BY merchant;

SELECT card, string_agg(note, ' | ' ORDER BY id) FROM payments GROUP BY card ORDER BY card;

SELECT card, array_agg(id ORDER BY id) FROM payments GROUP BY card ORDER BY card;

-- array_agg keeps NULLs
SELECT array_agg(DISTINCT qty ORDER BY qty) FROM payments;

SELECT bool_and(amount > 0), bool_or(amount > 100), every(qty > 0) FROM payments;

SELECT card, bool_and(merchant IS NOT NULL) FROM payments GROUP BY card ORDER BY card;

-- variance and stddev of an integer column are numeric
SELECT variance(qty), stddev(qty) FROM payments WHERE qty < 100;

SELECT var_pop(amount), stddev_pop(amount), var_samp(amount), stddev_samp(amount) FROM payments WHERE amount < 1000;

SELECT round(stddev(amount)::numeric, 6) FROM payments WHERE card = 'c-1';

-- the sample forms are NULL over one value
SELECT stddev(amount), variance(amount), stddev_pop(amount) FROM payments WHERE id = 1;

SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY amount) FROM payments;

SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY amount) FROM payments;

SELECT card, percentile_cont(0.9) WITHIN GROUP (ORDER BY amount) FROM payments GROUP BY card ORDER BY card;

SELECT percentile_cont(ARRAY[0.25, 0.5, 0.75]) WITHIN GROUP (ORDER BY amount) FROM payments;

SELECT percentile_disc(0.25) WITHIN GROUP (ORDER BY ts), percentile_disc(0.9) WITHIN GROUP (ORDER BY amount DESC) FROM payments;

SELECT mode() WITHIN GROUP (ORDER BY merchant) FROM payments;

SELECT count(*) FILTER (WHERE amount > 50) AS big, count(*) FILTER (WHERE merchant IS NULL) AS anon FROM payments;

SELECT card, sum(amount) FILTER (WHERE qty > 1) FROM payments GROUP BY card ORDER BY card;

SELECT card, max(amount) - min(amount) AS spread FROM payments GROUP BY card HAVING max(amount) > 100 ORDER BY spread DESC;

-- an aggregate over no rows: count is 0, the others NULL
SELECT count(*), count(amount) FROM payments WHERE false;

SELECT sum(amount), avg(amount), max(amount), string_agg(card, ','), bool_and(true) FROM payments WHERE false;

-- grouping with no rows gives no rows
SELECT card, count(*) FROM payments WHERE false GROUP BY card;

SELECT card, merchant, count(*) FROM payments GROUP BY card, merchant HAVING count(*) > 1;

SELECT date_trunc('day', ts) AS day, count(*), sum(qty) FROM payments GROUP BY 1 ORDER BY 1;

SELECT card, count(*) FROM payments GROUP BY ROLLUP (card) ORDER BY card;

SELECT merchant IS NULL AS anon, count(*) FROM payments GROUP BY merchant IS NULL ORDER BY 1;

SELECT sum(n), max(total), min(max_amount) FROM card_totals;

-- HAVING without GROUP BY makes one group
SELECT count(*) FROM payments HAVING count(*) > 10;

SELECT count(DISTINCT qty), sum(DISTINCT qty), avg(DISTINCT qty) FROM payments WHERE qty < 100;

SELECT card, count(*) FROM payments GROUP BY card HAVING sum(amount) > 300 AND count(merchant) > 5 ORDER BY card;

-- Everyday queries, run against both servers in stop 101.
SELECT count(*) FILTER (WHERE amount > 100), count(DISTINCT card), bool_and(amount > 0), bool_or(qty > 5) FROM payments;

SELECT string_agg(card, ',' ORDER BY card DESC) FROM (SELECT DISTINCT card FROM payments) c;

SELECT card, array_agg(id ORDER BY id) FROM payments GROUP BY card ORDER BY card LIMIT 3;

SELECT card, count(*) FROM payments GROUP BY card HAVING count(*) > 2 ORDER BY 2 DESC, 1;

SELECT avg(qty), sum(qty), avg(amount)::numeric(10,2) FROM payments;

SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY amount), mode() WITHIN GROUP (ORDER BY card) FROM payments;

SELECT min(ts), max(ts), max(ts) - min(ts) FROM payments;

SELECT count(*), count(note), count(DISTINCT note) FROM payments;

-- More everyday queries (stop 101).
SELECT sum(amount), avg(amount), min(amount), count(*) FROM payments WHERE id < 0;

SELECT card, sum(qty) FROM payments GROUP BY ROLLUP (card) ORDER BY card NULLS LAST LIMIT 4;

SELECT card, merchant, count(*) FROM payments GROUP BY GROUPING SETS ((card), (merchant)) ORDER BY card NULLS LAST, merchant NULLS LAST LIMIT 5;

SELECT coalesce(max(note), 'none') FROM payments WHERE id > 1000;

SELECT count(*) FILTER (WHERE note IS NULL) * 1.0 / count(*) FROM payments;

SELECT card, string_agg(DISTINCT merchant, '|' ORDER BY merchant) FROM payments GROUP BY card ORDER BY card LIMIT 3;

SELECT id % 3 AS g, sum(amount) FROM payments GROUP BY g ORDER BY g;

-- Queries over the metrics and the stream as a service would run them (stop 101).
SELECT card, count(*) AS n, round(avg(amount)::numeric, 2) FROM payments GROUP BY card HAVING avg(amount) > 20 ORDER BY card;

SELECT merchant, percentile_disc(0.5) WITHIN GROUP (ORDER BY amount) FROM payments GROUP BY merchant ORDER BY merchant NULLS LAST;

SELECT card, max(amount) FILTER (WHERE qty > 1), min(ts) FILTER (WHERE note IS NOT NULL) FROM payments GROUP BY card ORDER BY card LIMIT 4;

SELECT card, array_agg(DISTINCT merchant ORDER BY merchant) FILTER (WHERE merchant IS NOT NULL) FROM payments GROUP BY card ORDER BY card LIMIT 3;
