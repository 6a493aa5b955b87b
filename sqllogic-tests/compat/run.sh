#!/usr/bin/env bash
# The PostgreSQL-compatibility suite against a fresh Eddy and a fresh PostgreSQL 15:
#   sqllogic-tests/compat/run.sh [compat.py options, e.g. --report FILE --min-share 0.8]
# Nothing is built: Eddy is ${EDDY_BIN:-$CARGO_TARGET_DIR/debug/eddy} (CARGO_TARGET_DIR
# defaults to ~/.cache/eddy-target). PostgreSQL is Debian's postgresql-15 (installed if
# missing), a throwaway cluster in a temporary directory (UTF8, C.UTF-8 collation, as Eddy
# compares text by code point; TimeZone UTC, as Eddy's sessions start). Both listen on
# loopback only, on free ports, and are stopped by PID at the end, whatever happens.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/eddy-target}"
eddy_bin=$(realpath -m "${EDDY_BIN:-$CARGO_TARGET_DIR/debug/eddy}")
if [ ! -x "$eddy_bin" ]; then
  echo "run.sh: no Eddy binary at $eddy_bin; this script does not build. Build it first" \
    "(cargo build -p eddy-server --bin eddy) or point EDDY_BIN at one." >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
if [ ! -x /usr/lib/postgresql/15/bin/postgres ] || ! command -v psql >/dev/null; then
  apt-get update -qq && apt-get install -y -qq postgresql-15 postgresql-client-15 >/dev/null
fi

work=$(mktemp -d)
chmod 755 "$work"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
eport=$(free_port)
pport=$(free_port)
eddy_pid=""
pg_pid=""
cleanup() {
  if [ -n "$eddy_pid" ] && kill -TERM "$eddy_pid" 2>/dev/null; then wait "$eddy_pid" 2>/dev/null || true; fi
  if [ -n "$pg_pid" ] && kill -INT "$pg_pid" 2>/dev/null; then
    for _ in $(seq 1 100); do kill -0 "$pg_pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -rf "$work"
}
trap cleanup EXIT

"$eddy_bin" serve --pg-addr "127.0.0.1:$eport" --http-addr "127.0.0.1:$(free_port)" \
  --data-dir "$work/eddy" >"$work/eddy.log" 2>&1 &
eddy_pid=$!

mkdir -p "$work/pg" && chown postgres "$work/pg"
runuser -u postgres -- /usr/lib/postgresql/15/bin/initdb -D "$work/pg" -A trust -U postgres \
  -E UTF8 --locale=C.UTF-8 >/dev/null
runuser -u postgres -- /usr/lib/postgresql/15/bin/pg_ctl -D "$work/pg" -l "$work/pg/server.log" -w \
  -o "-c listen_addresses=127.0.0.1 -p $pport -c unix_socket_directories=$work/pg -c timezone=UTC" \
  start >/dev/null
pg_pid=$(head -1 "$work/pg/postmaster.pid")

for _ in $(seq 1 300); do
  psql -X -h 127.0.0.1 -p "$eport" -U eddy -d eddy -Atc 'SELECT 1' >/dev/null 2>&1 && break
  kill -0 "$eddy_pid" 2>/dev/null || break
  sleep 0.1
done
if ! psql -X -h 127.0.0.1 -p "$eport" -U eddy -d eddy -Atc 'SELECT 1' >/dev/null 2>&1; then
  echo "run.sh: $eddy_bin serve did not answer:" >&2
  cat "$work/eddy.log" >&2
  exit 1
fi

rc=0
python3 "$here/compat.py" --eddy "127.0.0.1:$eport" --postgres "127.0.0.1:$pport" "$@" || rc=$?
if ! kill -0 "$eddy_pid" 2>/dev/null; then
  echo "run.sh: Eddy exited during the run; its log:" >&2
  tail -50 "$work/eddy.log" >&2
  [ "$rc" -ne 0 ] || rc=1
fi
exit "$rc"
