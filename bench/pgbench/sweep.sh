#!/usr/bin/env bash
# Eddy against PostgreSQL 15 as the number of clients grows, per-event fraud scoring:
#   bench/pgbench/sweep.sh [SECONDS] [CLIENTS_LIST] [CARDS] [OUT_DIR]
# (defaults 10, "1 4 16 64 256", 100000, bench/results/sweep). Each transaction is one
# event, inserted and answered with its card's COUNT and SUM over the last 5 minutes:
# Eddy with a prepared `INSERT … RETURNING card_5m.n, card_5m.s` into a stream, PostgreSQL
# with `SELECT * FROM score(…)`, a PL/pgSQL function that inserts the row into a table
# (primary key, index on (card, ts)) and reads the card's window. For synchronous_commit
# off, then on, and each client count, pgbench (`-n -M prepared -T SECONDS -c N
# -j min(N,2)`, per-transaction logs) runs against Eddy, then PostgreSQL, both servers up.
# synchronous_commit is set at connection start, PGOPTIONS='-c synchronous_commit=MODE',
# on both; after each run `SHOW synchronous_commit` under the same PGOPTIONS is recorded
# (`synchronous_commit_seen`), so a server that ignored the option shows.
#
# The events, as pgbench can make them (its \set computes numbers only):
# - id: unique across clients and runs, `base + client_id * 10^9 + seq`, where base is
#   10^12 times the run's number (-D base=…) and seq a per-client counter: pgbench keeps a
#   client's variables from one transaction to the next, so `\set seq :seq + 1` (from
#   -D seq=0) counts its transactions. Eddy's stream keeps `event_id = 'id'` (no event is
#   a duplicate) and PostgreSQL's table its primary key.
# - ts: Eddy reads a text parameter for a TIMESTAMP column only as a timestamp's text
#   (no epoch numbers), and pgbench cannot format one, so each run passes the wall-clock
#   time (UTC) at its start as text, -D ts='YYYY-MM-DD HH:MM:SS': every event of a run has
#   the same event time, none is late, and the 5-minute window slides only from one run
#   to the next (each answer counts the card's events of the runs of the last 5 minutes).
# - card: random(1, CARDS), sent as the text of the number; amount: random(1, 100000)/100.0.
#
# Nothing is built: the Eddy binary is ${EDDY_BIN:-$CARGO_TARGET_DIR/release/eddy}
# (CARGO_TARGET_DIR defaults to ~/.cache/eddy-target). SYSTEMS="postgres" (or "eddy")
# runs one side only (default "eddy postgres"); MODES="on" (or "off") one synchronous_commit.
# ROUNDS=N (default 1) runs each point N times, the systems back to back in each round, and
# reports each system's median round and the median of the rounds' ratios (this machine's
# throughput moves by a third from one minute to the next). PostgreSQL is Debian's postgresql-15
# (installed if missing), a throwaway cluster in a temporary directory with
# max_connections=300; Eddy's default max_connections is 500. Both listen on loopback only
# and are stopped by PID at the end. Per point it prints throughput, latency percentiles
# (from the per-transaction logs), failed transactions and each server's CPU time (the
# postmaster and all its processes for PostgreSQL) per event; it writes OUT_DIR/sweep.json,
# OUT_DIR/sweep.md, OUT_DIR/throughput_{off,on}.svg and OUT_DIR/p99_{off,on}.svg
# (bench/pgbench/sweep.py), pgbench's output per point in OUT_DIR/runs/ and the two
# pgbench scripts in OUT_DIR.
#
# The floor, in the same run, when bench's binaries are built (FLOOR_BIN, PGFLOOR_BIN,
# default $CARGO_TARGET_DIR/release/{floor,pgfloor}):
# - `pgfloor`, a PostgreSQL-protocol server that does no work (one row per statement), is
#   a third system: pgbench runs Eddy's script against it at every point with commit off,
#   and at 1 client durable (`pgfloor --durable`: write and fdatasync before each answer;
#   it has no group commit, so it bounds one durable client only). No server scores more
#   than it with pgbench on this machine. SYSTEMS names it `floor`.
# - `floor` runs first: its loopback echoes, plain and durable, with a minimal client
#   (OUT_DIR/floor.json), reported as context at the end of sweep.md.
# sweep.md says whether each target was met in the run (ratios to PostgreSQL, each point
# against the one before, p99.9), and reads ratio targets against pgfloor's point too.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
seconds=${1:-10}
clients_list=${2:-1 4 16 64 256}
rounds=${ROUNDS:-1}
cards=${3:-100000}
out=$(realpath -m "${4:-$root/bench/results/sweep}")
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/eddy-target}"
eddy_bin=$(realpath -m "${EDDY_BIN:-$CARGO_TARGET_DIR/release/eddy}")
pgfloor_bin=$(realpath -m "${PGFLOOR_BIN:-$CARGO_TARGET_DIR/release/pgfloor}")
floor_bin=$(realpath -m "${FLOOR_BIN:-$CARGO_TARGET_DIR/release/floor}")
default_systems="eddy postgres"
if [ -x "$pgfloor_bin" ]; then default_systems+=" floor"; fi
systems=${SYSTEMS:-$default_systems}
cd "$root"
py=bench/pgbench/sweep.py

if [[ " $systems " == *" eddy "* && ! -x "$eddy_bin" ]]; then
  echo "sweep.sh: no Eddy binary at $eddy_bin; this script does not build. Build it first" \
    "(cargo build --release -p eddy-server --bin eddy) or point EDDY_BIN at one." >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
if [ ! -x /usr/lib/postgresql/15/bin/postgres ]; then
  apt-get update -qq && apt-get install -y -qq postgresql-15 >/dev/null
fi

work=$(mktemp -d)
chmod 755 "$work"
mkdir -p "$out/runs"
# pgbench's per-transaction logs go to memory when it can: written to the servers' disk,
# their dirty pages join every fsync's journal commit and slow both servers' commits.
if [ -d /dev/shm ] && [ -w /dev/shm ]; then logs=$(mktemp -d -p /dev/shm); else logs="$work/logs"; fi
mkdir -p "$logs"
rm -f "$out/runs/"*.txt
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
eport=$(free_port)
pport=$(free_port)
eddy_pid=""
pg_pid=""
floor_pids=()
cleanup() {
  if [ -n "$eddy_pid" ] && kill -TERM "$eddy_pid" 2>/dev/null; then wait "$eddy_pid" 2>/dev/null || true; fi
  for p in "${floor_pids[@]+"${floor_pids[@]}"}"; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null || true; done
  if [ -f "$work/pg/postmaster.pid" ]; then
    kill -INT "$(head -1 "$work/pg/postmaster.pid")" 2>/dev/null || true
    sleep 1
  fi
  rm -rf "$work" "${logs:-}"
}
trap cleanup EXIT

if [[ " $systems " == *" eddy "* ]]; then
  "$eddy_bin" serve --pg-addr "127.0.0.1:$eport" --http-addr "127.0.0.1:$(free_port)" \
    --data-dir "$work/eddy" >"$work/eddy.log" 2>&1 &
  eddy_pid=$!
  for _ in $(seq 1 200); do
    psql -X -h 127.0.0.1 -p "$eport" -U eddy -d eddy -Atc 'SELECT 1' >/dev/null 2>&1 && break
    sleep 0.1
  done
  if ! kill -0 "$eddy_pid" 2>/dev/null; then
    echo "sweep.sh: $eddy_bin serve exited:" >&2
    cat "$work/eddy.log" >&2
    exit 1
  fi
  psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$eport" -U eddy -d eddy <<'SQL'
CREATE STREAM payments (id BIGINT NOT NULL, ts TIMESTAMP NOT NULL, card TEXT NOT NULL, amount DOUBLE PRECISION)
    WITH (event_time = 'ts', event_id = 'id', partition_by = 'card', partitions = 4);
CREATE METRIC card_5m AS SELECT card, COUNT(*) AS n, SUM(amount) AS s FROM payments
    WINDOW SLIDING (SIZE 5 MINUTES) GROUP BY card;
SQL
fi

if [[ " $systems " == *" postgres "* ]]; then
  mkdir -p "$work/pg" && chown postgres "$work/pg"
  runuser -u postgres -- /usr/lib/postgresql/15/bin/initdb -D "$work/pg" -A trust -U postgres >/dev/null
  runuser -u postgres -- /usr/lib/postgresql/15/bin/pg_ctl -D "$work/pg" -l "$work/pg/server.log" -w \
    -o "-c listen_addresses=127.0.0.1 -p $pport -c unix_socket_directories=$work/pg -c max_connections=300" \
    start >/dev/null
  pg_pid=$(head -1 "$work/pg/postmaster.pid")
  psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$pport" -U postgres -d postgres <<'SQL'
CREATE TABLE payments (id BIGINT PRIMARY KEY, ts TIMESTAMP NOT NULL, card TEXT NOT NULL, amount DOUBLE PRECISION);
CREATE INDEX ON payments (card, ts);
CREATE FUNCTION score(i BIGINT, t TIMESTAMP, c TEXT, a DOUBLE PRECISION)
    RETURNS TABLE (n BIGINT, s DOUBLE PRECISION) LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO payments VALUES (i, t, c, a);
    RETURN QUERY SELECT count(*), sum(p.amount) FROM payments p
        WHERE p.card = c AND p.ts > t - INTERVAL '5 minutes' AND p.ts <= t;
END $$;
SQL
fi

if [[ " $systems " == *" floor "* ]]; then
  if [ ! -x "$pgfloor_bin" ]; then
    echo "sweep.sh: no pgfloor at $pgfloor_bin (cargo build --release -p eddy-bench --bin pgfloor)" >&2
    exit 1
  fi
  fport_off=$(free_port)
  fport_on=$(free_port)
  "$pgfloor_bin" --port "$fport_off" >/dev/null &
  floor_pids+=($!)
  "$pgfloor_bin" --port "$fport_on" --durable --dir "$work" >/dev/null &
  floor_pids+=($!)
  for port in "$fport_off" "$fport_on"; do
    for _ in $(seq 1 100); do
      psql -X -h 127.0.0.1 -p "$port" -U floor -d floor -Atc 'SELECT 1' >/dev/null 2>&1 && break
      sleep 0.1
    done
  done
fi

# The pgbench scripts, kept with the results.
vars='\set seq :seq + 1
\set id :base + :client_id * 1000000000 + :seq
\set card random(1, :cards)
\set amount random(1, 100000) / 100.0'
printf '%s\n%s\n' "$vars" 'INSERT INTO payments VALUES (:id, :ts, :card, :amount) RETURNING card_5m.n, card_5m.s;' \
  >"$out/eddy.pgbench"
printf '%s\n%s\n' "$vars" 'SELECT * FROM score(:id, :ts, :card, :amount);' >"$out/postgres.pgbench"

# The machine's floor in the same run, servers idle: bench's `floor`, when built, its
# durable echo on the servers' disk.
floor_args=()
if [ -x "$floor_bin" ]; then
  "$floor_bin" --seconds 3 --dir "$work" >"$out/floor.json"
  floor_args=(--floor "$out/floor.json")
fi

points="$work/points.jsonl"
: >"$points"
run=0
# One pgbench run: SYSTEM MODE CLIENTS ROUND. Appends the point to $points and prints it.
point() {
  local system=$1 mode=$2 n=$3 round=$4 port user pid
  local script=$system
  case $system in
    eddy) port=$eport user=eddy pid=$eddy_pid ;;
    postgres) port=$pport user=postgres pid=$pg_pid ;;
    floor)
      script=eddy user=floor
      if [ "$mode" = on ]; then port=$fport_on pid=${floor_pids[1]}; else port=$fport_off pid=${floor_pids[0]}; fi ;;
  esac
  local j=$((n < 2 ? n : 2)) tag="${system}_${mode}_${n}_r$round" rc=0
  run=$((run + 1))
  local cmd=(pgbench -n -M prepared -T "$seconds" -c "$n" -j "$j" --log "--log-prefix=$logs/$tag"
    -D "base=$((run * 1000000000000))" -D seq=0 -D "cards=$cards" -D "ts=$(date -u '+%Y-%m-%d %H:%M:%S')"
    -f "$out/$script.pgbench" -h 127.0.0.1 -p "$port" -U "$user" "$user")
  local cpu0 cpu1 children seen command
  command="PGOPTIONS='-c synchronous_commit=$mode' $(printf '%q ' "${cmd[@]}")"
  read -r cpu0 children < <(python3 "$py" cpu "$pid")
  PGOPTIONS="-c synchronous_commit=$mode" "${cmd[@]}" >"$out/runs/$tag.txt" 2>&1 || rc=$?
  # Once the run's backends have exited and been reaped: their CPU time is then the postmaster's.
  read -r cpu1 _ < <(python3 "$py" cpu "$pid" "$children")
  seen=$(PGOPTIONS="-c synchronous_commit=$mode" psql -X -h 127.0.0.1 -p "$port" -U "$user" -d "$user" \
    -Atc 'SHOW synchronous_commit' 2>&1 | tr '\n' ' ' | sed 's/ $//') || true
  python3 "$py" point --system "$system" --mode "$mode" --clients "$n" --round "$round" --seconds "$seconds" \
    --cards "$cards" --rc "$rc" --cpu0 "$cpu0" --cpu1 "$cpu1" --seen="$seen" \
    --pgbench-out "$out/runs/$tag.txt" --command="${command% }" \
    "$logs/$tag".* >>"$points"
  rm -f "$logs/$tag".*
}

for mode in ${MODES:-off on}; do
  for n in $clients_list; do
    for round in $(seq 1 "$rounds"); do
      for system in eddy postgres floor; do
        # The durable floor has no group commit: it bounds one client only.
        if [ "$system" = floor ] && [ "$mode" = on ] && [ "$n" != 1 ]; then continue; fi
        if [[ " $systems " == *" $system "* ]]; then point "$system" "$mode" "$n" "$round"; fi
      done
    done
  done
done
python3 "$py" report "$points" "$out" "${floor_args[@]+"${floor_args[@]}"}"
# Every point must have run in the mode it asked for at startup, and without failures.
python3 - "$points" <<'PY'
import json, sys
bad = []
for line in open(sys.argv[1]):
    p = json.loads(line)
    if p["system"] != "floor" and p["synchronous_commit_seen"] != p["synchronous_commit"]:
        bad.append(f'{p["system"]} {p["clients"]} clients ran with synchronous_commit {p["synchronous_commit_seen"]!r}, not {p["synchronous_commit"]}')
    if p.get("failed") or not p.get("tps"):
        bad.append(f'{p["system"]} {p["synchronous_commit"]} {p["clients"]} clients: {p.get("failed")} failed, {p.get("tps")} tps')
if bad:
    sys.exit("sweep.sh: " + "; ".join(bad))
PY
