-- A scripted psql session: the five-minute tour of the README, with expected output in
-- tour.expected. Run by server/tests/protocol.rs against a fresh server.
\set ON_ERROR_STOP 0
CREATE STREAM payments (
    id        BIGINT NOT NULL,
    ts        TIMESTAMP NOT NULL,
    card      TEXT NOT NULL,
    merchant  TEXT,
    amount    DOUBLE PRECISION
) WITH (event_time = 'ts', event_id = 'id', partition_by = 'card', partitions = 4, lateness = '5 seconds');
CREATE METRIC card_5m AS
SELECT card, COUNT(*) AS tx_count, SUM(amount) AS tx_sum, AVG(amount) AS tx_avg, MAX(amount) AS tx_max
FROM payments WINDOW SLIDING (SIZE 5 MINUTES) WHERE amount > 0 GROUP BY card;
INSERT INTO payments VALUES (1, '2026-11-22 10:00:00', 'c-1', 'm-7', 12.5) RETURNING *;
INSERT INTO payments VALUES (2, '2026-11-22 10:02:00', 'c-1', 'm-8', 7.5) RETURNING card_5m.tx_count, card_5m.tx_sum;
INSERT INTO payments VALUES (3, '2026-11-22 10:06:00', 'c-1', 'm-7', 1.0) RETURNING card_5m.tx_count, card_5m.tx_sum;
INSERT INTO payments VALUES (4, '2026-11-22 10:05:00', 'c-1', 'm-7', 2.0) RETURNING card_5m.tx_count;
\copy payments FROM stdin (FORMAT csv)
5,2026-11-22 10:06:30,c-2,m-1,100
6,2026-11-22 10:06:31,c-2,m-2,-5
\.
SELECT * FROM card_5m ORDER BY card;
SELECT card, tx_sum FROM card_5m WHERE card = 'c-2';
SELECT count(*) AS events, sum(amount) AS total FROM payments;
EXPLAIN METRIC card_5m;
SELECT * FROM no_such_metric;
INSERT INTO payments VALUES (7, 'yesterday-ish', 'c-1', 'm', 1);
SELECT 'still usable' AS status;
