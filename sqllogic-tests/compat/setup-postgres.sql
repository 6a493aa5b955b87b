-- PostgreSQL's side of the compatibility suite: a table with the stream's columns, a view
-- per Eddy metric (same name, same columns, the same aggregates over every row), then the
-- shared rows.
CREATE TABLE payments (
    id       BIGINT NOT NULL,
    ts       TIMESTAMP NOT NULL,
    card     TEXT NOT NULL,
    merchant TEXT,
    amount   DOUBLE PRECISION,
    qty      INTEGER,
    note     TEXT
);

CREATE VIEW card_totals AS
SELECT card, count(*) AS n, sum(amount) AS total, max(amount) AS max_amount
FROM payments GROUP BY card;

CREATE VIEW merchant_totals AS
SELECT merchant, count(*) AS n, count(qty) AS n_qty, sum(qty) AS qty,
       min(amount) AS min_amount, avg(amount) AS avg_amount
FROM payments GROUP BY merchant;

CREATE VIEW card_stats AS
SELECT card, count(DISTINCT merchant) AS merchants, min(ts) AS first_ts, max(ts) AS last_ts
FROM payments GROUP BY card;

\ir rows.sql
