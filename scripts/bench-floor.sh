#!/usr/bin/env bash
# What recording an event costs at least on this machine, in time: the three instructions every
# event executes that take tens of cycles whatever surrounds them (the clock's `rdtsc`; the
# counter page's locked add, which keeps the count of events made visible after a SIGKILL; the
# ring tail's compare-and-swap; a locked instruction also waits for the stores before it), each
# timed in a loop of 5x10^7 beside an add (an estimate: in a hook, other work may overlap);
# then the untraced two-site loop's time per cudaMalloc+cudaFree pair, and the wall-time ratio
# those three alone set for `oomtrace run` of that loop (two events a pair). Instruction counts
# carry over between machines; these do not (a locked instruction or `rdtsc` costs 5 to 40
# cycles depending on the processor and the hypervisor), which is why the run's ratio of issue
# 37 item 4 differs between two 2-core VMs for the same build.
# Usage: scripts/bench-floor.sh [EVENTS]   (x86-64; default 5000000; needs a C compiler and a release
# build: cargo build --release). Prints a Markdown table.
set -euo pipefail
cd "$(dirname "$0")/.."
EVENTS=${1:-5000000}
CC=${CC:-cc}
command -v "$CC" >/dev/null || { echo "bench-floor: a C compiler is needed (apt-get install gcc)" >&2; exit 1; }
BUILD_OUT=$(ls -t target/release/build/oomtrace-tests-*/output 2>/dev/null | head -1)
[ -n "$BUILD_OUT" ] || { echo "bench-floor: no release build (cargo build --release)" >&2; exit 1; }
SIM=$(grep -o 'OOMTRACE_SIM_LIB=.*' "$BUILD_OUT" | cut -d= -f2)
BIN=$(grep -o 'OOMTRACE_SCENARIO_BIN=.*' "$BUILD_OUT" | cut -d= -f2)
WORK=$(mktemp -d -t oomtrace-floor-XXXXXX)
trap 'rm -rf "$WORK"' EXIT

cat > "$WORK/floor.c" <<'EOF'
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>
#include <x86intrin.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(void) {
    const long n = 50000000;
    volatile uint64_t sink = 0;
    _Atomic uint64_t word = 0;
    double t = now();
    for (long i = 0; i < n; i++) sink = sink + (uint64_t)i;
    printf("plain_add %.2f\n", (now() - t) / n * 1e9);
    t = now();
    for (long i = 0; i < n; i++) sink = __rdtsc();
    printf("rdtsc %.2f\n", (now() - t) / n * 1e9);
    t = now();
    for (long i = 0; i < n; i++) atomic_fetch_add_explicit(&word, 1, memory_order_relaxed);
    printf("locked_add %.2f\n", (now() - t) / n * 1e9);
    t = now();
    for (long i = 0; i < n; i++) {
        uint64_t seen = atomic_load_explicit(&word, memory_order_relaxed);
        atomic_compare_exchange_strong(&word, &seen, seen + 1);
    }
    printf("load_and_cas %.2f\n", (now() - t) / n * 1e9);
    return (int)(sink & 0);
}
EOF
"$CC" -O2 -o "$WORK/floor" "$WORK/floor.c"
# Medians of five runs of each.
for i in 1 2 3 4 5; do "$WORK/floor"; done > "$WORK/ops"
for i in 1 2 3 4 5; do
    s=$(date +%s%N)
    LD_LIBRARY_PATH=$SIM "$BIN/two_sites" "$EVENTS" > /dev/null
    e=$(date +%s%N)
    echo "pair $(( (e - s) * 2 / EVENTS ))"
done >> "$WORK/ops"
python3 - "$WORK/ops" "$EVENTS" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    k, v = line.split()
    rows.setdefault(k, []).append(float(v))
m = {k: statistics.median(v) for k, v in rows.items()}
per_event = m["rdtsc"] + m["locked_add"] + m["load_and_cas"]
print(f"| figure | ns (median of 5) |\n|---|---:|")
for k, what in [("plain_add", "an add through memory (a store, then a load of it)"), ("rdtsc", "`rdtsc` (the event's time)"),
                ("locked_add", "a locked add (the count of events made)"),
                ("load_and_cas", "a load and compare-and-swap (the ring's tail)")]:
    print(f"| {what} | {m[k]:.2f} |")
print(f"| the three, per event | {per_event:.2f} |")
print(f"| untraced two-site loop, per pair ({sys.argv[2]} events) | {m['pair']:.0f} |")
print(f"| `run`'s wall-time ratio those three alone set (two events a pair) | {1 + 2 * per_event / m['pair']:.3f}x |")
PY
