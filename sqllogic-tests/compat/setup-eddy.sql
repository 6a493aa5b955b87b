-- Eddy's side of the compatibility suite: the stream, its metrics (WINDOW INFINITE only, so
-- each is a plain aggregate PostgreSQL computes with a view), then the shared rows.
-- merchant is a second partitioner so that a metric may be grouped by it alone; lateness
-- and retention are long enough that no row of rows.sql is late or expired.
CREATE STREAM payments (
    id       BIGINT NOT NULL,
    ts       TIMESTAMP NOT NULL,
    card     TEXT NOT NULL,
    merchant TEXT,
    amount   DOUBLE PRECISION,
    qty      INTEGER,
    note     TEXT
) WITH (event_time = 'ts', event_id = 'id', partition_by = 'card, merchant', partitions = 4,
        lateness = '30 days', retention = '3650 days');

CREATE METRIC card_totals AS
SELECT card, COUNT(*) AS n, SUM(amount) AS total, MAX(amount) AS max_amount
FROM payments WINDOW INFINITE GROUP BY card;

CREATE METRIC merchant_totals AS
SELECT merchant, COUNT(*) AS n, COUNT(qty) AS n_qty, SUM(qty) AS qty,
       MIN(amount) AS min_amount, AVG(amount) AS avg_amount
FROM payments WINDOW INFINITE GROUP BY merchant;

CREATE METRIC card_stats AS
SELECT card, COUNT(DISTINCT merchant) AS merchants, MIN(ts) AS first_ts, MAX(ts) AS last_ts
FROM payments WINDOW INFINITE GROUP BY card;

\ir rows.sql
