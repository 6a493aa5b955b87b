#!/usr/bin/env bash
# Eddy against PostgreSQL 15, in one run on this machine:
#   bench/pgbench/compare.sh [SECONDS] [CLIENTS] [GROUPS] [ROUNDS]
# 1. prepared point lookups (pgbench), ROUNDS runs of each server in turn (default 3):
#    this machine's noise moves one run by ±15 %, so the medians are compared. `pgfloor`
#    (bench/src/bin/pgfloor.rs: a server that answers every statement with one row and
#    does no work) runs in the same turns: what no server can beat with this client on
#    this machine, so a target is also read as a share of it (`floor_tps`);
# 2. per-event scoring, one event per round trip from psycopg (bench/pgbench/score.py),
#    with synchronous_commit on and off.
# Eddy (release build) gets a stream and a metric with GROUPS groups (COPY); PostgreSQL
# (Debian's postgresql-15, a throwaway cluster in a temporary directory) gets the same
# rows in a table with a primary key. pgbench runs bench/pgbench/lookup_random.sql
# against each with `-n -M prepared -c CLIENTS -j CLIENTS` and prints both TPS figures.
# Both servers listen on loopback only and are stopped by PID at the end.
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${1:-20}
clients=${2:-2}
groups=${3:-100000}
rounds=${4:-3}

export DEBIAN_FRONTEND=noninteractive
if [ ! -x /usr/lib/postgresql/15/bin/postgres ]; then
  apt-get update -qq && apt-get install -y -qq postgresql-15 >/dev/null
fi
python3 -c 'import psycopg' 2>/dev/null || python3 -m pip install -q "psycopg[binary]" 2>/dev/null \
  || python3 -m pip install -q --break-system-packages "psycopg[binary]"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/eddy-target}"
storage/rocksdb/build-lib
cargo build --release -q --workspace --bins

work=$(mktemp -d)
chmod 755 "$work"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
eport=$(free_port)
pport=$(free_port)
fport=$(free_port)
eddy_pid=""
floor_pid=""
cleanup() {
  [ -n "$eddy_pid" ] && kill -TERM "$eddy_pid" 2>/dev/null && wait "$eddy_pid" 2>/dev/null || true
  [ -n "$floor_pid" ] && kill -TERM "$floor_pid" 2>/dev/null && wait "$floor_pid" 2>/dev/null || true
  if [ -f "$work/pg/postmaster.pid" ]; then
    kill -INT "$(head -1 "$work/pg/postmaster.pid")" 2>/dev/null || true
    sleep 1
  fi
  rm -rf "$work"
}
trap cleanup EXIT

# The rows: card c-1 … c-GROUPS, one event each.
python3 - "$groups" >"$work/rows.csv" <<'PY'
import sys, datetime
base = datetime.datetime(2026, 11, 22, 10, 0, 0)
for i in range(1, int(sys.argv[1]) + 1):
    print(f"{base + datetime.timedelta(seconds=i)},c-{i},{i % 1000}")
PY

"$CARGO_TARGET_DIR/release/eddy" serve --pg-addr "127.0.0.1:$eport" --http-addr "127.0.0.1:$(free_port)" \
  --data-dir "$work/eddy" >"$work/eddy.log" 2>&1 &
eddy_pid=$!
for _ in $(seq 1 200); do
  psql -h 127.0.0.1 -p "$eport" -U eddy -d eddy -Atc 'SELECT 1' >/dev/null 2>&1 && break
  sleep 0.1
done
psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$eport" -U eddy -d eddy <<SQL
CREATE STREAM lk_payments (ts TIMESTAMP NOT NULL, card TEXT NOT NULL, amount DOUBLE PRECISION)
    WITH (event_time = 'ts', partition_by = 'card', partitions = 4);
CREATE METRIC pgb_card AS SELECT card, COUNT(*) AS n, SUM(amount) AS total
    FROM lk_payments WINDOW INFINITE GROUP BY card;
\copy lk_payments FROM '$work/rows.csv' (FORMAT csv)
SQL

mkdir -p "$work/pg" && chown postgres "$work/pg"
runuser -u postgres -- /usr/lib/postgresql/15/bin/initdb -D "$work/pg" -A trust -U postgres >/dev/null
runuser -u postgres -- /usr/lib/postgresql/15/bin/pg_ctl -D "$work/pg" -l "$work/pg/server.log" -w \
  -o "-c listen_addresses=127.0.0.1 -p $pport -c unix_socket_directories=$work/pg" start >/dev/null
psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$pport" -U postgres -d postgres <<SQL
CREATE TABLE pgb_card (card TEXT PRIMARY KEY, n BIGINT, total DOUBLE PRECISION);
CREATE TEMP TABLE raw (ts TIMESTAMP, card TEXT, amount DOUBLE PRECISION);
\copy raw FROM '$work/rows.csv' (FORMAT csv)
INSERT INTO pgb_card SELECT card, count(*), sum(amount) FROM raw GROUP BY card;
ANALYZE pgb_card;
SQL

sed "s/random(1, 4)/random(1, $groups)/" bench/pgbench/point_lookup.sql >"$work/lookup.sql"
"$CARGO_TARGET_DIR/release/pgfloor" --port "$fport" >/dev/null &
floor_pid=$!
tps() {
  pgbench -n -M prepared -f "$work/lookup.sql" -T "$seconds" -c "$clients" -j "$clients" \
    -h 127.0.0.1 -p "$1" -U "$2" "$3" 2>/dev/null | awk '/^tps/ {print $3; exit}'
}
# Alternating, so a slow stretch of the machine lands on both servers.
eddy_runs=()
pg_runs=()
floor_runs=()
for _ in $(seq 1 "$rounds"); do
  eddy_runs+=("$(tps "$eport" eddy eddy)")
  pg_runs+=("$(tps "$pport" postgres postgres)")
  floor_runs+=("$(tps "$fport" eddy eddy)")
done
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
list() { local IFS=,; echo "[$*]"; }
eddy_tps=$(median "${eddy_runs[@]}")
pg_tps=$(median "${pg_runs[@]}")
floor_tps=$(median "${floor_runs[@]}")
for sync in on off; do
  python3 bench/pgbench/score.py eddy "host=127.0.0.1 port=$eport user=eddy dbname=eddy" "$seconds" "$groups" "$sync"
  python3 bench/pgbench/score.py postgres "host=127.0.0.1 port=$pport user=postgres dbname=postgres" "$seconds" "$groups" "$sync"
done
echo "{\"point_lookup\": {\"groups\": $groups, \"clients\": $clients, \"seconds\": $seconds, \"rounds\": $rounds, \"eddy_tps\": $eddy_tps, \"postgresql15_tps\": $pg_tps, \"floor_tps\": $floor_tps, \"eddy_runs\": $(list "${eddy_runs[@]}"), \"postgresql15_runs\": $(list "${pg_runs[@]}"), \"floor_runs\": $(list "${floor_runs[@]}")}}"
