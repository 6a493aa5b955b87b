#!/usr/bin/env bash
# Unavailability per fault kind (issue 57): runs the nemesis test (server/tests/nemesis.rs,
# release build: a broker of its own, three nodes with a 4 s session timeout behind TCP
# proxies, writers and readers through every node) RUNS times, and reports, per fault
# kind, the median and the worst of the longest time a card (one task's group) went
# without an acknowledged write: over the whole fault, and after its heal (the node or
# the broker back); and the longest time a writer went from a failed statement to its
# next success.
#
# Usage: bench/nemesis.sh [RUNS] [SECONDS_OF_FAULTS] [OUT_FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-3}"
seconds="${2:-120}"
out="${3:-bench/results/nemesis.txt}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/eddy-target}"
.ci/kafka install
mkdir -p "$(dirname "$out")"
report=$(mktemp)
trap 'rm -f "$report"' EXIT
for run in $(seq 1 "$runs"); do
  echo "== nemesis run $run of $runs" >&2
  EDDY_NEMESIS_REPORT="$report" EDDY_NEMESIS_SECONDS="$seconds" \
    cargo test --release -p eddy-server --test nemesis -- --nocapture 2>&1 |
    grep -E '^(nemesis seed|nemesis fault [0-9]+:|[0-9]+ writes|test result|seed [0-9]+: |card [0-9]+:|event [0-9]+ |acknowledged event)' >&2
done
python3 - "$report" "$runs" <<'PYEOF' | tee "$out"
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
kinds = {}
for kind, _target, total, after, failing in rows:
    kinds.setdefault(kind, []).append((int(total), int(after), int(failing)))
print(f"nemesis: {sys.argv[2]} runs, {len(rows)} faults; session timeout 4 s")
print("card: the longest a card went without an acknowledged write; heal: the same after the")
print("node or broker was back; failed: the longest a writer went from sending a statement that")
print("failed to its next success (the issue's measure). Each as median / worst, in ms.")
print(f"{'fault':<12} {'count':>5} {'card':>13} {'heal':>13} {'failed':>13}")
for kind in sorted(kinds):
    runs = kinds[kind]
    cols = [sorted(r[i] for r in runs) for i in range(3)]
    fmt = lambda c: f"{int(statistics.median(c))} / {max(c)}"
    print(f"{kind:<12} {len(runs):>5} {fmt(cols[0]):>13} {fmt(cols[1]):>13} {fmt(cols[2]):>13}")
PYEOF
