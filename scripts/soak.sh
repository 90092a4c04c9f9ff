#!/usr/bin/env bash
# Soak: a long run at a steady event rate through a standalone collector, sampling the
# collector's RSS; passes if the RSS stays flat (memory follows live allocations, not events).
# Not part of the default test run. Usage: scripts/soak.sh [SECONDS] [PAIRS_PER_S]
# (default 600 s at 150000 pairs/s = 300 k events/s). Prints a Markdown report on stdout.
set -euo pipefail
SECS=${1:-600}
RATE=${2:-150000}
cd "$(dirname "$0")/.."
cargo build --release -q
cargo build --release -q -p oomtrace-tests --tests
# The build script's output of the current build (older build directories may linger).
OUT=$(ls -t target/release/build/oomtrace-tests-*/output | head -1)
BIN=$(grep -o 'OOMTRACE_SCENARIO_BIN=.*' "$OUT" | cut -d= -f2)
SIM=$(grep -o 'OOMTRACE_SIM_LIB=.*' "$OUT" | cut -d= -f2)
WORK=$(mktemp -d)
trap 'kill $COLLECTOR 2>/dev/null || true; rm -rf "$WORK"' EXIT
SOCK=$WORK/c.sock
TRACE=$WORK/soak.oomt
target/release/oomtrace collect --quiet --socket "$SOCK" --output "$TRACE" &
COLLECTOR=$!
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done
LD_LIBRARY_PATH=$SIM LD_PRELOAD=$PWD/target/release/liboomtrace.so OOMTRACE_SOCKET=$SOCK \
    "$BIN/soak" "$SECS" "$RATE" > "$WORK/app.out" &
APP=$!
: > "$WORK/rss.csv"
START=$(date +%s)
while kill -0 $APP 2>/dev/null; do
    RSS=$(awk '/VmRSS/ {print $2}' /proc/$COLLECTOR/status)
    echo "$(( $(date +%s) - START )),$RSS" >> "$WORK/rss.csv"
    sleep 10
done
wait $APP
kill -INT $COLLECTOR; wait $COLLECTOR || true
REPORT_START=$(date +%s.%N)
target/release/oomtrace report --json "$TRACE" > "$WORK/report.json"
REPORT_END=$(date +%s.%N)
python3 - "$WORK" "$SECS" "$RATE" "$(echo "$REPORT_END - $REPORT_START" | bc)" "$(stat -c %s "$TRACE")" <<'PY'
import json, sys
work, secs, rate, report_s, size = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5])
rows = [tuple(int(x) for x in l.split(",")) for l in open(f"{work}/rss.csv") if l.strip()]
r = json.load(open(f"{work}/report.json"))
p = r["processes"][0]
app = open(f"{work}/app.out").read().strip()
half = len(rows) // 2
first = max(kb for _, kb in rows[1:half]) if half > 1 else rows[0][1]
last = max(kb for _, kb in rows[half:])
ok = last <= first * 1.10 + 1024
print(f"- workload: `soak {secs} {rate}` ({app})")
print(f"- events: {p['events']}, lost: {p['lost_events']}, steps: {p['steps']}, live at exit: {p['devices'][0]['live_at_exit_bytes']} B")
print(f"- trace: {size/1e6:.0f} MB ({size/max(p['events'],1):.1f} B/event); `oomtrace report` took {report_s:.1f} s ({p['events']/report_s/1e6:.1f} M events/s)")
print(f"- collector RSS (KiB), every 10 s: first half max {first}, second half max {last}: {'STABLE' if ok else 'GREW'}")
print("- samples (s,KiB): " + " ".join(f"{t},{kb}" for t, kb in rows))
sys.exit(0 if ok else 1)
PY
