CREATE STREAM pay (id BIGINT NOT NULL, ts TIMESTAMP NOT NULL, card TEXT NOT NULL,
    merchant TEXT, amount DOUBLE PRECISION, qty INTEGER, ok BOOLEAN, at TIMESTAMPTZ)
    WITH (event_time = 'ts', event_id = 'id', partition_by = 'card', partitions = 3,
          lateness = '2 seconds')
-- eddy:end
CREATE METRIC card_5m AS SELECT card, COUNT(*) AS n, SUM(amount) AS total,
    AVG(amount) AS mean, MIN(amount) AS low, MAX(amount) AS high, STDDEV(amount) AS sd,
    COUNT(DISTINCT merchant) AS merchants, LAST_VALUE(amount) AS last_amount
    FROM pay WINDOW SLIDING (SIZE 5 MINUTES) WHERE amount > 0 GROUP BY card
-- eddy:end
CREATE METRIC card_day AS SELECT card, COUNT(*) AS n, SUM(qty) AS qty,
    MEDIAN(amount) AS median, PERCENTILE_DISC(0.9) WITHIN GROUP (ORDER BY qty) AS p90
    FROM pay WINDOW TUMBLING (SIZE 1 DAY) GROUP BY card
-- eddy:end
CREATE METRIC card_last5 AS SELECT card, COUNT(*) AS n, SUM(amount) AS total,
    MAX(at) AS latest FROM pay WINDOW SLIDING (SIZE 5 EVENTS) GROUP BY card
-- eddy:end
CREATE METRIC card_merchant AS SELECT card, merchant, COUNT(*) AS n, SUM(qty) AS qty
    FROM pay WINDOW INFINITE WHERE ok GROUP BY card, merchant
-- eddy:end
CREATE STREAM clicks (ts TIMESTAMP NOT NULL, usr TEXT NOT NULL, page TEXT NOT NULL)
    WITH (event_time = 'ts', partition_by = 'page', partitions = 2)
-- eddy:end
CREATE METRIC page_views AS SELECT page, COUNT(*) AS n, COUNT(DISTINCT usr) AS users
    FROM clicks WINDOW SLIDING (SIZE 1 HOUR) GROUP BY page
-- eddy:end
CREATE ROLE "reader" WITH LOGIN NOSUPERUSER
-- eddy:end
GRANT SELECT ON METRIC "card_5m" TO "reader"
-- eddy:end
