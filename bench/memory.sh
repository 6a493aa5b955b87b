#!/usr/bin/env bash
# Peak memory of a real `eddy` (release) loaded by COPY, against the number of keys and
# the window length:
#   [WINDOWS='5 minutes,7 days' or '5 minutes;5 minutes, DELAY 1 day'] [DAYS=N] [EDDY_BIN=…]
#   [BACKFILL='30 days'] bench/memory.sh [EVENTS] [KEYS...]
# For each KEYS (default 10000 100000 1000000) and each window (5 minutes, 7 days), a
# fresh server gets `payments` (one task) and COUNT/SUM/AVG per card over the window,
# then EVENTS rows (default 5 000 000, 10 000 per second of event time, or spread over
# DAYS days of it) by one COPY from psql, out of a CSV file written first. Prints one
# JSON line per run: peak RSS (VmHWM), RSS after the load, and the COPY's rate. With
# BACKFILL, the streams keep that much and a metric over a window of that size is created
# after the load: how many events it read back and how fast (its CREATE METRIC's time).
# Servers listen on loopback and are stopped by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
events=${1:-5000000}
shift || true
keys=("$@")
[ ${#keys[@]} -gt 0 ] || keys=(10000 100000 1000000)
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/eddy-target}"
# EDDY_BIN: measure that binary, built by nobody here.
if [ -z "${EDDY_BIN:-}" ]; then
  storage/rocksdb/build-lib
  cargo build --release -q -p eddy-server --bin eddy
fi
eddy="${EDDY_BIN:-$CARGO_TARGET_DIR/release/eddy}"

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

# Windows are separated by commas, or by semicolons when one holds a comma (DELAY).
sep=,
case "${WINDOWS:-}" in *\;*) sep=';' ;; esac
IFS=$sep read -ra windows <<<"${WINDOWS:-5 minutes,7 days}"
for window in "${windows[@]}"; do
  # The reservoir keeps what the window needs whatever the retention; a count window's
  # size is no interval.
  retention=${window%%,*}
  case "$retention" in *EVENTS*) retention='1 minute' ;; esac
  # A backfilled metric needs its window's events stored.
  retention=${BACKFILL:-$retention}
  for k in "${keys[@]}"; do
    rm -rf "$work/data"
    port=$(free_port)
    "$eddy" serve --pg-addr "127.0.0.1:$port" --http-addr "127.0.0.1:$(free_port)" \
      --data-dir "$work/data" >"$work/eddy.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 100); do
      psql -h 127.0.0.1 -p "$port" -U eddy -d eddy -Atc 'SELECT 1' >/dev/null 2>&1 && break
      sleep 0.1
    done
    psql -q -h 127.0.0.1 -p "$port" -U eddy -d eddy -v ON_ERROR_STOP=1 >/dev/null <<SQL
CREATE STREAM payments (id BIGINT NOT NULL, ts TIMESTAMP NOT NULL, card TEXT NOT NULL,
  amount DOUBLE PRECISION) WITH (event_time = 'ts', retention = '$retention');
CREATE METRIC card_window AS SELECT card, COUNT(*) AS n, SUM(amount) AS total,
  AVG(amount) AS mean FROM payments WINDOW SLIDING (SIZE $window) GROUP BY card;
SQL
    csv="$work/events-$k.csv"
    [ -f "$csv" ] || python3 - "$events" "$k" "${DAYS:-0}" >"$csv" <<'PY'
import sys, datetime
events, keys, days = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
step_us = days * 86_400_000_000 / events if days > 0 else 100
base = datetime.datetime(2027, 1, 1)
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
    start=$(date +%s.%N)
    psql -q -h 127.0.0.1 -p "$port" -U eddy -d eddy -v ON_ERROR_STOP=1 \
      -c "COPY payments FROM STDIN (FORMAT csv)" <"$csv" >/dev/null
    end=$(date +%s.%N)
    stored=$(psql -h 127.0.0.1 -p "$port" -U eddy -d eddy -Atc "SELECT count(*) FROM card_window")
    backfill=""
    if [ -n "${BACKFILL:-}" ]; then
      # A metric created after the load computes its window from the stored events.
      bstart=$(date +%s.%N)
      psql -q -h 127.0.0.1 -p "$port" -U eddy -d eddy -v ON_ERROR_STOP=1 -c "CREATE METRIC \
        card_backfill AS SELECT card, COUNT(*) AS n, SUM(amount) AS total, AVG(amount) AS mean \
        FROM payments WINDOW SLIDING (SIZE $BACKFILL) GROUP BY card" >/dev/null
      bend=$(date +%s.%N)
      covered=$(psql -h 127.0.0.1 -p "$port" -U eddy -d eddy -Atc "SELECT sum(n) FROM card_backfill")
      backfill=$(printf ', "backfill": "%s", "backfill_events": %s, "backfill_rows_per_sec": %.0f' \
        "$BACKFILL" "$covered" "$(echo "$covered / ($bend - $bstart)" | bc -l)")
    fi
    printf '{"window": "%s", "keys": %s, "events": %s, "groups": %s, "peak_rss_mb": %d, "rss_after_mb": %d, "load_rows_per_sec": %.0f%s}\n' \
      "$window" "$k" "$events" "$stored" $(( $(kb VmHWM) / 1024 )) $(( $(kb VmRSS) / 1024 )) \
      "$(echo "$events / ($end - $start)" | bc -l)" "$backfill"
    kill -TERM "$pid"
    wait "$pid" 2>/dev/null || true
    pid=""
  done
done
