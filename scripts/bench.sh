#!/usr/bin/env bash
# Every benchmark of docs/targets.md and issue 24 in one run, printed as one Markdown document:
# each figure beside its target and the baseline measured in the same run. Not part of the
# test run: a benchmark is not a timed test. Usage: scripts/bench.sh > bench/$(date +%F)-table.md
#
# Method, for a shared machine where a single run's figure swings by 2x: the modes of each group
# run in alternation (scripts/bench-alternate.py: every mode once per round, the order rotated
# each round), each run times its rounds in wall time and in the allocating thread's CPU time,
# and the table gives per mode the median over runs of each run's median round and the fastest
# round of all, with the cost against the baseline's runs of the same rounds
# (scripts/bench-table.py). The load average is printed before and after.
#
# Knobs (environment; defaults give medians of 5 alternated runs and take about 15 minutes once
# the hot path meets issue 24's targets; small values for a quick look):
#   RUNS=5                  alternated runs per group (each group below takes its own override)
#   TORCH_RUNS TORCH_N=20000 TORCH_ROUNDS=7   per-tensor group (0 runs: skip; skipped without the venv)
#   NATIVE_RUNS NATIVE_PAIRS=1000000 NATIVE_ROUNDS=3   bench_pairs through `oomtrace run`
#   PYTHON_RUNS PYTHON_PAIRS=100000 PYTHON_ROUNDS=5    ctypes pairs with Python frames
#   E2E_RUNS E2E_EVENTS=5000000    two_sites under `oomtrace run`, and `oomtrace report` of it
#   SOAK_SECONDS=2 (0: skip)       sustained-rate ladder, seconds per step
#   INGEST=1 (0: skip)  EVENTS BIG_EVENTS ...   tests/benches/ingest.rs (its own knobs pass through)
#   PAIRS_FOR_MEMORY=16700000 (0: skip)   shim RSS over 3 passes of that many pairs
#   HOOK_ROUNDS=0                  >0: also tests/benches/hook.rs (collector in-process), in details
#   INSTRUCTIONS=1 (0: skip)       per-tensor and per-pair instructions (scripts/bench-instructions.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
# The knobs this run was given, for the document's command line.
KNOBS="RUNS TORCH_RUNS TORCH_N TORCH_ROUNDS NATIVE_RUNS NATIVE_PAIRS NATIVE_ROUNDS PYTHON_RUNS PYTHON_PAIRS
    PYTHON_ROUNDS E2E_RUNS E2E_EVENTS SOAK_SECONDS INGEST EVENTS BIG_EVENTS PROCESSES LIVE PAIRS_FOR_MEMORY HOOK_ROUNDS INSTRUCTIONS"
SET=$(for k in $KNOBS; do [ -z "${!k+x}" ] || printf '%s=%s ' "$k" "${!k}"; done)
RUNS=${RUNS:-5}
cargo build --release -q
cargo build --release -q -p oomtrace-tests --benches
WORK=$(mktemp -d -t oomtrace-bench-XXXXXX)
trap 'rm -rf "$WORK"' EXIT
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
START=$(date +%s)

# The build script's output of the current build (older build directories may linger).
BUILD_OUT=$(ls -t target/release/build/oomtrace-tests-*/output | head -1)
BIN=$(grep -o 'OOMTRACE_SCENARIO_BIN=.*' "$BUILD_OUT" | cut -d= -f2)
SIM=$(grep -o 'OOMTRACE_SIM_LIB=.*' "$BUILD_OUT" | cut -d= -f2)
SHIM=$ROOT/target/release/liboomtrace.so
OOMTRACE=$ROOT/target/release/oomtrace
# `oomtrace run` with this build's shim, the trace in the work directory.
RUN="env OOMTRACE_LIB=$SHIM $OOMTRACE run"
alternate() { python3 scripts/bench-alternate.py "$@"; }

# Real PyTorch (the test tier's venv, scripts/torch-env.sh) on simcuda: per-tensor host cost
# (kernels are no-ops there) untraced, traced, traced without native frames, and with
# PyTorch's own recorder. Address-space randomisation off, as in the tests.
TORCH_RUNS=${TORCH_RUNS:-$RUNS}
if [ "$TORCH_RUNS" -gt 0 ] && TORCH_PY=$(scripts/torch-env.sh 2>/dev/null); then
    T="env LD_LIBRARY_PATH=$SIM CUDA_MODULE_LOADING=LAZY ROUNDS=${TORCH_ROUNDS:-7} setarch -R"
    B="$TORCH_PY scripts/bench-torch.py ${TORCH_N:-20000}"
    alternate --runs "$TORCH_RUNS" --json "$WORK/torch.json" \
        --mode untraced "$T $B" \
        --mode tracker "rm -f $WORK/t1.oomt; $T $RUN -o $WORK/t1.oomt -- $B" \
        --mode trace-tracker "rm -f $WORK/t3.oomt; $T env OOMTRACE_TORCH_ENTRY=tracker $RUN -o $WORK/t3.oomt -- $B" \
        --mode tracker-python "rm -f $WORK/t2.oomt; $T env OOMTRACE_STACKS=python $RUN -o $WORK/t2.oomt -- $B" \
        --mode history-python "$T env BENCH_RECORD_HISTORY=python $B" \
        --mode history-all "$T env BENCH_RECORD_HISTORY=all $B"
fi

# Native pairs, 30 frames deep without frame pointers, through the real CLI (its collector in
# its own process): the full-speed rows.
NATIVE_RUNS=${NATIVE_RUNS:-$RUNS}
if [ "$NATIVE_RUNS" -gt 0 ]; then
    P="$BIN/bench_pairs ${NATIVE_PAIRS:-1000000} ${NATIVE_ROUNDS:-3}"
    N="env LD_LIBRARY_PATH=$SIM"
    alternate --runs "$NATIVE_RUNS" --json "$WORK/native.json" \
        --mode baseline "$N $P" \
        --mode forward "$N LD_PRELOAD=$SHIM OOMTRACE_DISABLE=1 $P" \
        --mode events "rm -f $WORK/n1.oomt; $N OOMTRACE_STACKS=off $RUN -o $WORK/n1.oomt -- $P" \
        --mode stacks "rm -f $WORK/n2.oomt; $N $RUN -o $WORK/n2.oomt -- $P"
fi

# Python frames: the same pairs from CPython through ctypes, 20 Python frames deep.
PYTHON_RUNS=${PYTHON_RUNS:-$RUNS}
if [ "$PYTHON_RUNS" -gt 0 ]; then
    Y="env LD_LIBRARY_PATH=$SIM ROUNDS=${PYTHON_ROUNDS:-5}"
    B="python3 scripts/bench-python.py ${PYTHON_PAIRS:-100000}"
    alternate --runs "$PYTHON_RUNS" --json "$WORK/python.json" \
        --mode untraced "$Y $B" \
        --mode native "rm -f $WORK/y1.oomt; $Y OOMTRACE_PYTHON=0 $RUN -o $WORK/y1.oomt -- $B" \
        --mode frames "rm -f $WORK/y2.oomt; $Y $RUN -o $WORK/y2.oomt -- $B"
fi

# End to end: the two-site loop's events through `oomtrace run` (the whole run's wall time,
# and the program's own), then `oomtrace report` of the last traces.
E2E_RUNS=${E2E_RUNS:-$RUNS}
if [ "$E2E_RUNS" -gt 0 ]; then
    P="$BIN/two_sites ${E2E_EVENTS:-5000000}"
    N="env LD_LIBRARY_PATH=$SIM"
    alternate --runs "$E2E_RUNS" --json "$WORK/e2e.json" \
        --mode untraced "$N $P" \
        --mode off "rm -f $WORK/e-off.oomt; $N OOMTRACE_STACKS=off $RUN -o $WORK/e-off.oomt -- $P" \
        --mode stacks "rm -f $WORK/e-stacks.oomt; $N $RUN -o $WORK/e-stacks.oomt -- $P"
    alternate --runs "$E2E_RUNS" --json "$WORK/report.json" \
        --mode off "$OOMTRACE report $WORK/e-off.oomt > /dev/null" \
        --mode stacks "$OOMTRACE report $WORK/e-stacks.oomt > /dev/null"
fi

# Sustained rate: soak paced at rising rates (x1.5 a step) under `oomtrace run`, until it
# achieves less than 98 % of the requested rate; first its untraced full speed.
SOAK_SECONDS=${SOAK_SECONDS:-2}
if [ "$SOAK_SECONDS" != 0 ]; then
    # soak's own rate ("(N events/s)"); a failed run stops the benchmark with its last lines.
    achieved() {
        local out
        out=$("$@" 2> "$WORK/soak.err") || { echo "bench.sh: soak failed: $(tail -3 "$WORK/soak.err")" >&2; exit 1; }
        echo "$out" | grep -o '([0-9.]* events/s' | tr -d '(' | cut -d' ' -f1
    }
    echo "untraced 1e12 $(achieved env LD_LIBRARY_PATH=$SIM "$BIN/soak" "$SOAK_SECONDS" 1e12) full" > "$WORK/soak.txt"
    pairs=25000
    while :; do
        rm -f "$WORK/soak.oomt"
        got=$(achieved env LD_LIBRARY_PATH=$SIM $RUN -o "$WORK/soak.oomt" -- "$BIN/soak" "$SOAK_SECONDS" "$pairs")
        want=$((2 * pairs))
        if python3 -c "import sys; sys.exit(0 if $got >= 0.98 * $want else 1)"; then
            echo "traced $want $got kept" >> "$WORK/soak.txt"
        else
            echo "traced $want $got fell_behind" >> "$WORK/soak.txt"
            break
        fi
        pairs=$((pairs * 3 / 2))
        [ "$pairs" -lt 100000000 ] || break
    done
fi

# Collector figures: metric, value, baseline, target (tab-separated).
if [ "${INGEST:-1}" != 0 ]; then
    cargo bench -q -p oomtrace-tests --bench ingest > "$WORK/ingest.txt" 2>/dev/null
fi
# In-process collector hook bench (its own alternated rounds), shown in the details.
if [ "${HOOK_ROUNDS:-0}" -gt 0 ]; then
    ROUNDS=$HOOK_ROUNDS PAIRS=${NATIVE_PAIRS:-1000000} cargo bench -q -p oomtrace-tests --bench hook > "$WORK/hook.txt" 2>/dev/null
fi

# Instructions per tensor and per pair (callgrind: independent of the machine's load), 0 to
# skip (about 17 minutes; needs valgrind).
if [ "${INSTRUCTIONS:-1}" != 0 ] && command -v valgrind >/dev/null 2>&1; then
    scripts/bench-instructions.sh > "$WORK/instructions.md"
fi

# Shim memory over ~10^8 events: bench_pairs (3 passes of N pairs, 2 events each) traced,
# against the same program untraced; max RSS of the program from /usr/bin/time. Untraced, each
# pair frees what it allocated and nothing grows with N: 10^6 pairs give its RSS in a
# fraction of the time.
PAIRS=${PAIRS_FOR_MEMORY:-16700000}
if [ "$PAIRS" -gt 0 ]; then
    LD_LIBRARY_PATH=$SIM /usr/bin/time -f "%M" -o "$WORK/base.rss" "$BIN/bench_pairs" $((PAIRS < 1000000 ? PAIRS : 1000000)) > /dev/null
    ( cd "$WORK" && LD_LIBRARY_PATH=$SIM LD_PRELOAD="$SHIM" OOMTRACE_COLLECTOR="$OOMTRACE" \
        OOMTRACE_OUTPUT="$WORK/mem2.oomt" \
        /usr/bin/time -f "%M" -o "$WORK/shim.rss" "$BIN/bench_pairs" "$PAIRS" > /dev/null )
    "$OOMTRACE" report --json "$WORK/mem2.oomt" | python3 -c 'import json,sys; print(json.load(sys.stdin)["processes"][0]["events"])' > "$WORK/memory-events.txt"
fi

echo "# oomtrace benchmarks — $(date +%F)"
echo
echo "Machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(uname -sr), $(rustc --version)."
echo "Command: \`${SET}scripts/bench.sh\`, $(( $(date +%s) - START )) s. No GPU: the simulated CUDA stands in for the driver."
echo "Load average (1, 5, 15 min): $LOAD_BEFORE before, $(cut -d' ' -f1-3 /proc/loadavg) after."
echo
echo "Median: over the alternated runs, of each run's median round; fastest: the fastest round"
echo "of all runs; a difference is the median over rounds of (mode - baseline) in the same round,"
echo "then fastest - fastest. Thread CPU: the allocating thread's own CPU time."
echo
python3 scripts/bench-table.py "$WORK"
if [ -s "$WORK/instructions.md" ]; then
    echo
    echo "Instructions per tensor on real PyTorch and per pair from C (scripts/bench-instructions.sh, valgrind's callgrind):"
    echo
    cat "$WORK/instructions.md"
fi
