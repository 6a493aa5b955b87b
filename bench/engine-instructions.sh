#!/usr/bin/env bash
# Instructions per event inside one task, a figure machine noise cannot move:
#   bench/engine-instructions.sh [EVENTS] [CARDS] [RATE] [AGGS] [BATCH]
# Callgrind counts the instructions executed inside `Task::ingest` (and what it calls)
# while `engine --mode task` runs, and divides by EVENTS. RATE is events per second of
# event time: at 1000, the 5-minute window fills after 300 000 events, so most of the
# default 1 M events also make one leave. BATCH is events per `Task::ingest` call (1: one
# event per call, as a single-row INSERT; more, as a multi-row INSERT, COPY or Kafka poll).
set -euo pipefail
cd "$(dirname "$0")/.."
events=${1:-1000000}
cards=${2:-100000}
rate=${3:-1000}
aggs=${4:-basic}
batch=${5:-1}
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/eddy-target}"
command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind >/dev/null; }
storage/rocksdb/build-lib
cargo build --release -q -p eddy-bench --bin engine
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
valgrind --tool=callgrind --callgrind-out-file="$out/task" --collect-atstart=no \
  --toggle-collect='eddy_cluster::exec::task::Task::ingest' \
  "$CARGO_TARGET_DIR/release/engine" --mode task --events "$events" --cards "$cards" \
  --rate "$rate" --aggs "$aggs" --batch "$batch" >/dev/null 2>"$out/log" || { tail -5 "$out/log" >&2; exit 1; }
total=$(awk '/^summary:/ {print $2}' "$out/task")
echo "{\"events\": $events, \"cards\": $cards, \"rate\": $rate, \"aggs\": \"$aggs\", \"batch\": $batch, \"instructions_per_event\": $(( total / events ))}"
