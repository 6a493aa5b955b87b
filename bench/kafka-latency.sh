#!/usr/bin/env bash
# End-to-end latency through Kafka (seed 002 §5): starts a Kafka broker (.ci/kafka) and
# a release `eddy serve --kafka`, runs bench/src/bin/kafka_latency.rs at the given rates,
# and stops both by PID. Extra arguments go to the injector, e.g. --rates 25000.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/eddy-target}"
storage/rocksdb/build-lib
cargo build --release -p eddy-server --bin eddy -p eddy-bench --bin kafka_latency

work=$(mktemp -d)
eddy_pid=""
cleanup() {
  if [ -n "$eddy_pid" ]; then kill -TERM "$eddy_pid" 2>/dev/null || true; wait "$eddy_pid" 2>/dev/null || true; fi
  .ci/kafka stop "$work/kafka" || true
  rm -rf "$work"
}
trap cleanup EXIT

# The broker runs with ZGC unless KAFKA_JVM_PERFORMANCE_OPTS says otherwise: with Kafka's
# default G1, its young-generation pauses (about one every 2.5 s, 17 ms median, up to 38 ms
# on 2 cores) were the top of the latency distribution.
export KAFKA_JVM_PERFORMANCE_OPTS="${KAFKA_JVM_PERFORMANCE_OPTS:--XX:+UseZGC}"
kafka=$(.ci/kafka start "$work/kafka")
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
http=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$CARGO_TARGET_DIR/release/eddy" serve --kafka "$kafka" --pg-addr "127.0.0.1:$port" \
  --http-addr "127.0.0.1:$http" --data-dir "$work/data" >"$work/eddy.log" 2>&1 &
eddy_pid=$!
for _ in $(seq 1 300); do
  grep -q "listening on" "$work/eddy.log" && break
  kill -0 "$eddy_pid" 2>/dev/null || { cat "$work/eddy.log"; exit 1; }
  sleep 0.1
done
# One unmeasured 30 s run first: the fresh broker compiles its hot paths meanwhile.
"$CARGO_TARGET_DIR/release/kafka_latency" --kafka "$kafka" --pg "127.0.0.1:$port" --prewarm 30 "$@"
