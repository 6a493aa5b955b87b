#!/usr/bin/env bash
# Point-in-time reads of a real `eddy` (release) over stored events:
#   [EDDY_BIN=…] bench/history.sh [EVENTS] [KEYS] [DAYS] [LOOKUPS]
# A fresh server gets `payments` (one task, so one shard does all the work) with a
# 5-minute and a 1-hour SLIDING COUNT/SUM/AVG per card, then EVENTS rows (default
# 5 000 000 over KEYS = 100 000 cards) spread over DAYS = 30 days of event time, by COPY.
# Then:
# - `COPY (SELECT * FROM history('card_5m') WHERE …) TO STDOUT` over 1 day and over all
#   DAYS: rows/s streamed to psql, and the server's peak RSS during the read (VmHWM reset
#   before it through /proc/PID/clear_refs), which must not grow with the range;
# - LOOKUPS (default 300) `SELECT * FROM card_1h AS OF TIMESTAMP … WHERE card = …` at
#   random times and cards from one psycopg connection: p50/p99/max latency.
# Prints one JSON object: the load, each history read and the lookups. The server listens
# on loopback and is stopped by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
events=${1:-5000000}
keys=${2:-100000}
days=${3:-30}
lookups=${4:-300}
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/eddy-target}"
if [ -z "${EDDY_BIN:-}" ]; then
  storage/rocksdb/build-lib
  cargo build --release -q -p eddy-server --bin eddy
fi
eddy="${EDDY_BIN:-$CARGO_TARGET_DIR/release/eddy}"
python3 -c 'import psycopg' 2>/dev/null || python3 -m pip install -q "psycopg[binary]" 2>/dev/null \
  || python3 -m pip install -q --break-system-packages "psycopg[binary]"

work=$(mktemp -d)
pid=""
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
kb() { awk -v k="$1:" '$1 == k {print $2}' "/proc/$pid/status"; }

port=$(free_port)
"$eddy" serve --pg-addr "127.0.0.1:$port" --http-addr "127.0.0.1:$(free_port)" \
  --data-dir "$work/data" >"$work/eddy.log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do
  psql -h 127.0.0.1 -p "$port" -U eddy -d eddy -Atc 'SELECT 1' >/dev/null 2>&1 && break
  sleep 0.1
done
sql() { psql -q -h 127.0.0.1 -p "$port" -U eddy -d eddy -v ON_ERROR_STOP=1 "$@"; }
sql >/dev/null <<SQL
CREATE STREAM payments (id BIGINT NOT NULL, ts TIMESTAMP NOT NULL, card TEXT NOT NULL,
  amount DOUBLE PRECISION) WITH (event_time = 'ts', event_id = 'id',
  retention = '$((days + 1)) days');
CREATE METRIC card_5m AS SELECT card, COUNT(*) AS n, SUM(amount) AS total,
  AVG(amount) AS mean FROM payments WINDOW SLIDING (SIZE 5 MINUTES) GROUP BY card;
CREATE METRIC card_1h AS SELECT card, COUNT(*) AS n, SUM(amount) AS total,
  AVG(amount) AS mean FROM payments WINDOW SLIDING (SIZE 1 HOUR) GROUP BY card;
SQL
python3 - "$events" "$keys" "$days" >"$work/events.csv" <<'PY'
import sys, datetime
events, keys, days = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
step_us = days * 86_400_000_000 / events
base = datetime.datetime(2026, 10, 1)
state = 0x9E3779B97F4A7C15
out = sys.stdout
buf = []
for i in range(events):
    state ^= (state << 13) & 0xFFFFFFFFFFFFFFFF
    state ^= state >> 7
    state ^= (state << 17) & 0xFFFFFFFFFFFFFFFF
    ts = base + datetime.timedelta(microseconds=int(i * step_us))
    buf.append(f"{i},{ts:%Y-%m-%d %H:%M:%S.%f},card-{state % keys},{state % 100000 / 100}\n")
    if len(buf) == 10000:
        out.write("".join(buf))
        buf.clear()
out.write("".join(buf))
PY
sql -c "COPY payments FROM STDIN (FORMAT csv)" <"$work/events.csv" >/dev/null
rm -f "$work/events.csv"
echo "{\"loaded\": $events, \"rss_kib\": $(kb VmRSS)}" >"$work/lines"

# History over 1 day, then over everything, each streamed to psql and counted.
for range in "1 day" "$days days"; do
  echo 5 >"/proc/$pid/clear_refs"
  before=$(kb VmRSS)
  start=$(date +%s.%N)
  rows=$(sql -c "COPY (SELECT * FROM history('card_5m') WHERE ts >= TIMESTAMP '2026-10-01' \
    + INTERVAL '$days days' - INTERVAL '$range') TO STDOUT" | wc -l)
  end=$(date +%s.%N)
  python3 - "$range" "$rows" "$start" "$end" "$before" "$(kb VmHWM)" <<'PY'
import json, sys
r, rows, start, end, before, peak = sys.argv[1], int(sys.argv[2]), *map(float, sys.argv[3:5]), *map(int, sys.argv[5:7])
print(json.dumps({"history": r, "rows": rows, "seconds": round(end - start, 2),
                  "rows_per_s": round(rows / (end - start)), "rss_before_kib": before,
                  "peak_during_kib": peak}))
PY
done >>"$work/lines"

# AS OF point lookups on the 1-hour metric at random times and cards.
(python3 - "$port" "$keys" "$days" "$lookups" <<'PY'
import datetime, json, random, sys, time
import psycopg
port, keys, days, n = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
base = datetime.datetime(2026, 10, 1)
rng = random.Random(7)
with psycopg.connect(f"host=127.0.0.1 port={port} user=eddy dbname=eddy", autocommit=True) as c:
    cur = c.cursor()
    took, found = [], 0
    for _ in range(n):
        t = base + datetime.timedelta(seconds=rng.uniform(3600, days * 86400 - 60))
        card = f"card-{rng.randrange(keys)}"
        start = time.perf_counter()
        cur.execute(f"SELECT n, total FROM card_1h AS OF TIMESTAMP '{t}' WHERE card = '{card}'")
        found += len(cur.fetchall())
        took.append(time.perf_counter() - start)
    took.sort()
    pick = lambda q: round(took[min(len(took) - 1, int(q * len(took)))] * 1000, 2)
    print(json.dumps({"as_of_lookups": n, "groups_found": found, "p50_ms": pick(0.5),
                      "p99_ms": pick(0.99), "max_ms": round(took[-1] * 1000, 2)}))
PY
) >>"$work/lines"
python3 - "$work/lines" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
print(json.dumps({"load": lines[0], "history": [l for l in lines if "history" in l],
                  "as_of": next(l for l in lines if "as_of_lookups" in l)}, indent=1))
PY
