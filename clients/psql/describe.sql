-- psql's describe commands against a stream and a metric, with expected output in
-- describe.expected. Run by server/tests/protocol.rs against a fresh server.
\set ON_ERROR_STOP 0
CREATE STREAM payments (
    id        BIGINT NOT NULL,
    ts        TIMESTAMP NOT NULL,
    card      TEXT NOT NULL,
    amount    DOUBLE PRECISION
) WITH (event_time = 'ts', event_id = 'id', partition_by = 'card', partitions = 4, lateness = '5 seconds');
CREATE METRIC card_5m AS
SELECT card, COUNT(*) AS tx_count, SUM(amount) AS tx_sum, MAX(amount) AS tx_max
FROM payments WINDOW SLIDING (SIZE 5 MINUTES) WHERE amount > 0 GROUP BY card;
\d
\dt
\dv
\d payments
\d+ payments
\d card_5m
\d+ card_5m
\d no_such_relation
\dn
\l
\du
\df
SELECT 'still usable' AS status;
