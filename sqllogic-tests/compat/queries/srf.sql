-- Set-returning functions: generate_series over integers, numerics and timestamps, in
-- FROM (with a column alias, WITH ORDINALITY, LATERAL) and in the select list, and unnest
-- (several arrays side by side are zipped, the shorter padded with NULLs).

SELECT * FROM generate_series(1, 5);

SELECT generate_series(1, 3) AS n;

SELECT x FROM generate_series(1, 10, 3) AS g(x);

SELECT generate_series(5, 1, -2);

SELECT * FROM generate_series(TIMESTAMP '2026-10-24', TIMESTAMP '2026-10-27', INTERVAL '1 day') AS d(day) ORDER BY day;

SELECT d::date AS day, count(p.id) FROM generate_series(TIMESTAMP '2026-10-24', TIMESTAMP '2026-11-02', INTERVAL '1 day') AS d LEFT JOIN payments p ON p.ts >= d AND p.ts < d + INTERVAL '1 day' GROUP BY d ORDER BY d;

SELECT card, generate_series(1, 2) AS k FROM card_totals ORDER BY card, k;

SELECT unnest(ARRAY[1, 2, 3]);

SELECT * FROM unnest(ARRAY['a', 'b']) AS u(letter);

SELECT unnest(ARRAY[1, 2]), unnest(ARRAY['x', 'y', 'z']);

SELECT * FROM unnest(ARRAY[1, 2], ARRAY['a', 'b', 'c']) AS t(n, s);

SELECT * FROM unnest(ARRAY['x', 'y']) WITH ORDINALITY AS t(v, i);

SELECT * FROM generate_series(1, 3) WITH ORDINALITY;

SELECT n, n * n FROM generate_series(1, 4) AS n ORDER BY n DESC;

SELECT count(*) FROM generate_series(1, 1000);

SELECT sum(n) FROM generate_series(1, 100) AS n;

SELECT generate_series(0.5, 2.0, 0.5);

SELECT * FROM generate_series(1, 0);

SELECT id, unnest(string_to_array(note, ',')) AS part FROM payments WHERE id = 9;

SELECT p.id, g FROM payments p, generate_series(1, p.qty) AS g WHERE p.id = 4 ORDER BY g;

SELECT generate_series(1, 3) + 10 AS v;

SELECT * FROM generate_subscripts(ARRAY['a', 'b', 'c'], 1) AS s;

SELECT h, count(p.id) FROM generate_series(0, 23, 6) AS h LEFT JOIN payments p ON extract(hour FROM p.ts) >= h AND extract(hour FROM p.ts) < h + 6 GROUP BY h ORDER BY h;

SELECT card, unnest(ARRAY[n, n * 2]) AS v FROM card_totals WHERE card = 'c-1';

SELECT * FROM generate_series(TIMESTAMP '2026-11-01 00:00', TIMESTAMP '2026-11-01 01:00', INTERVAL '20 minutes');

-- generate_series takes integer bounds of any width.
SELECT * FROM generate_series(1::smallint, 7, 3::int) AS g;

-- Everyday queries, run against both servers in stop 101.
SELECT generate_series(1, 3), generate_series(timestamp '2026-01-01', timestamp '2026-01-02', interval '12 hours');

SELECT * FROM unnest(ARRAY[1, 2, 3]) WITH ORDINALITY AS t(v, i);
