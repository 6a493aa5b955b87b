"""Per-event scoring, one event per round trip, as a psycopg user writes it.

    python3 score.py eddy|postgres DSN SECONDS CARDS on|off

Each event is inserted and answered with its card's COUNT/SUM/AVG over the last 5
minutes: Eddy with a prepared `INSERT … RETURNING`, PostgreSQL 15 with one SQL function
per event that inserts the row and reads its window (an index on (card, ts)). Both run
with the given `synchronous_commit`. The first 200 answers are checked against an exact
recomputation in Python. Prints one JSON line.
"""

import datetime
import json
import sys
import time

import psycopg

system, dsn, seconds, cards, sync = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
base = datetime.datetime(2026, 1, 1)

conn = psycopg.connect(dsn, autocommit=True)
if system == "eddy":
    conn.execute("DROP STREAM IF EXISTS sc_pay CASCADE")
    conn.execute(
        "CREATE STREAM sc_pay (id BIGINT NOT NULL, ts TIMESTAMP NOT NULL, card TEXT NOT NULL, "
        "amount DOUBLE PRECISION) WITH (event_time = 'ts', event_id = 'id', partition_by = 'card', partitions = 4)"
    )
    conn.execute(
        "CREATE METRIC sc_card AS SELECT card, COUNT(*) AS n, SUM(amount) AS total, AVG(amount) AS mean "
        "FROM sc_pay WINDOW SLIDING (SIZE 5 MINUTES) GROUP BY card"
    )
    score = "INSERT INTO sc_pay VALUES (%s, %s, %s, %s) RETURNING sc_card.n, sc_card.total, sc_card.mean"
else:
    conn.execute("DROP TABLE IF EXISTS sc_pay CASCADE")
    conn.execute("CREATE TABLE sc_pay (id BIGINT PRIMARY KEY, ts TIMESTAMP NOT NULL, card TEXT NOT NULL, amount DOUBLE PRECISION)")
    conn.execute("CREATE INDEX ON sc_pay (card, ts)")
    conn.execute(
        "CREATE OR REPLACE FUNCTION sc_score(i BIGINT, t TIMESTAMP, c TEXT, a DOUBLE PRECISION) "
        "RETURNS TABLE (n BIGINT, total DOUBLE PRECISION, mean DOUBLE PRECISION) LANGUAGE sql AS $$ "
        "INSERT INTO sc_pay VALUES (i, t, c, a); "
        "SELECT count(*), sum(amount), avg(amount) FROM sc_pay "
        "WHERE card = c AND ts > t - INTERVAL '5 minutes' AND ts <= t $$"
    )
    score = "SELECT * FROM sc_score(%s, %s, %s, %s)"
conn.execute(f"SET synchronous_commit = {sync}")

window = {}
latencies = []
started = time.perf_counter()
i = 0
while time.perf_counter() - started < seconds:
    ts = base + datetime.timedelta(milliseconds=i)
    card = f"c{(i * 2654435761) % cards}"
    amount = (i % 1000) / 10.0
    t0 = time.perf_counter()
    row = conn.execute(score, (i, ts, card, amount), prepare=True).fetchone()
    latencies.append(time.perf_counter() - t0)
    if i < 200:
        events = window.setdefault(card, [])
        events.append((ts, amount))
        live = [a for (t, a) in events if ts - datetime.timedelta(minutes=5) < t <= ts]
        want = (len(live), sum(live))
        assert row[0] == want[0] and abs(row[1] - want[1]) <= 1e-9 * max(1.0, abs(want[1])), (i, row, want)
    i += 1
elapsed = time.perf_counter() - started
latencies.sort()
q = lambda p: round(latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000, 3)
print(json.dumps({"system": system, "synchronous_commit": sync, "events": i,
                  "events_per_sec": round(i / elapsed), "p50_ms": q(0.5), "p99_ms": q(0.99),
                  "p999_ms": q(0.999), "max_ms": round(latencies[-1] * 1000, 3)}))
