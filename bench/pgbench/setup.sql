-- The stream and metric the pgbench point-lookup script reads (bench/pgbench/point_lookup.sql).
DROP STREAM IF EXISTS pgb_payments CASCADE;
CREATE STREAM pgb_payments (ts TIMESTAMP NOT NULL, card TEXT NOT NULL, amount DOUBLE PRECISION)
    WITH (event_time = 'ts', partition_by = 'card', partitions = 4);
CREATE METRIC pgb_card AS SELECT card, COUNT(*) AS n, SUM(amount) AS total
    FROM pgb_payments WINDOW SLIDING (SIZE 5 MINUTES) GROUP BY card;
INSERT INTO pgb_payments VALUES
    ('2026-11-22 10:00:00', 'c-1', 10), ('2026-11-22 10:00:01', 'c-2', 20),
    ('2026-11-22 10:00:02', 'c-3', 30), ('2026-11-22 10:00:03', 'c-4', 40);
