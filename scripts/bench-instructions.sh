#!/usr/bin/env bash
# Per-tensor and per-pair cost in instructions (valgrind's callgrind), which do not depend on
# what else the machine runs: the figures of scripts/bench.sh that a shared 2-core machine
# cannot make swing. For each mode, the instructions over a run of N1 and of N2 tensors
# (bench-torch.py, one round); (I(N2) - I(N1)) / (N2 - N1) is the cost of one tensor (alloc +
# free), start-up and import cancelling out. The same for cudaMalloc+cudaFree pairs from C
# (bench_pairs, 30 frames deep without frame pointers; 20,000 and 80,000 pairs).
#
# The PyTorch runs count the allocating thread inside the timed loop only: callgrind dumps its
# counts at each `time.thread_time_ns()` (bench-torch.py reads it right before and right after
# the loop), and the program's column is the second part, the loop's. Counted over the whole
# run instead, the difference of two runs took in what differs between them once (a heap
# consolidation at exit or start-up: up to 785 instructions a tensor on 2026-12-06, one build
# measured twice).
#
# Every process of a traced run is counted (callgrind follows `oomtrace run`'s children), so
# the cost that leaves the program's thread is in the table too:
#   program's thread  the allocating thread (the hook, its guard, clock, device query, queue push)
#   drain             the program's other threads, over the same program untraced (the shim's
#                     drain thread, which writes the events to the collector)
#   collector         every thread of `oomtrace collect` (decoding, the live model, the trace file)
#   run's replay      `oomtrace run` itself at exit: since its collector hands it the report
#                     (cli/src/handoff.rs) only printing it; before, reading the trace back
# Prints two Markdown tables, then (with --tsv FILE) the figures as `mode<TAB>column<TAB>value`
# lines for tests/it/instructions.rs, which keeps them from regressing.
# Usage: scripts/bench-instructions.sh [--pairs-only] [--torch-modes "M ..."] [--tsv FILE] [N1 N2]
# (default 1000 4000 tensors, every PyTorch mode: about a minute a PyTorch run, two runs at a
# time, the import of torch most of it; the pairs take under a minute). `--torch-modes "untraced
# methods"` measures those modes alone (tests/it/instructions.rs, with 300 1200: the loop is
# counted alone, so fewer tensors give the same figure). Needs valgrind (Debian: valgrind) and
# the test tier's PyTorch venv (without it, the per-pair table only).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PAIRS_ONLY= TSV=
MODES="untraced methods trace-tracker history-python"
while [ $# -gt 0 ]; do
    case $1 in
        --pairs-only) PAIRS_ONLY=1; shift ;;
        --torch-modes) MODES=$2; shift 2 ;;
        --tsv) TSV=$2; shift 2 ;;
        *) break ;;
    esac
done
case " $MODES " in
    *" untraced "*) ;;
    *) echo "bench-instructions: --torch-modes needs untraced (every figure is over it)" >&2; exit 2 ;;
esac
N1=${1:-1000}
N2=${2:-4000}
command -v valgrind >/dev/null || { echo "bench-instructions: valgrind is needed (apt-get install valgrind)" >&2; exit 1; }
TORCH_PY=
[ -n "$PAIRS_ONLY" ] || TORCH_PY=$(scripts/torch-env.sh 2>/dev/null) || TORCH_PY=
BUILD_OUT=$(ls -t target/release/build/oomtrace-tests-*/output | head -1)
SIM=$(grep -o 'OOMTRACE_SIM_LIB=.*' "$BUILD_OUT" | cut -d= -f2)
BIN=$(grep -o 'OOMTRACE_SCENARIO_BIN=.*' "$BUILD_OUT" | cut -d= -f2)
WORK=$(mktemp -d -t oomtrace-instr-XXXXXX)
trap 'rm -rf "$WORK"' EXIT

# One run: MODE N -> $WORK/MODE.N.PID.cg-TT (one file per process and thread; -01 is each
# process's main thread), and MODE.N.PID.cg.K-TT for each part before a dump (PyTorch runs).
one() {
    local mode=$1 n=$2 out=$WORK/$1.$2
    local vg="valgrind --tool=callgrind --trace-children=yes --separate-threads=yes --dump-before=time_thread_time_ns --callgrind-out-file=$out.%p.cg"
    local run="env OOMTRACE_LIB=$ROOT/target/release/liboomtrace.so $ROOT/target/release/oomtrace run -o $out.oomt --"
    local b="$TORCH_PY $ROOT/scripts/bench-torch.py $n"
    (
        export LD_LIBRARY_PATH=$SIM CUDA_MODULE_LOADING=LAZY ROUNDS=1 PYTHONHASHSEED=0
        case $mode in
            untraced) setarch -R $vg $b ;;
            methods) setarch -R $vg $run $b ;;
            trace-tracker) OOMTRACE_TORCH_ENTRY=tracker setarch -R $vg $run $b ;;
            history-python) BENCH_RECORD_HISTORY=python setarch -R $vg $b ;;
            pairs-untraced) $vg "$BIN/bench_pairs" "$n" 1 ;;
            pairs-events) OOMTRACE_STACKS=off $vg $run "$BIN/bench_pairs" "$n" 1 ;;
            pairs-stacks) $vg $run "$BIN/bench_pairs" "$n" 1 ;;
        esac
    ) >"$out.log" 2>&1
}

# Instructions of MODE's run of N in WHERE: program (its allocating thread), program-others,
# collector, run.
count() { python3 scripts/bench-instructions-count.py "$WORK" "$1" "$2" "$3"; }
# Per unit (tensor or pair) between the two runs.
per() { echo $(( ($(count "$1" "$3" "$4") - $(count "$1" "$2" "$4")) / ($3 - $2) )); }
tsv() { [ -z "$TSV" ] || printf '%s\t%s\t%s\n' "$1" "$2" "$3" >> "$TSV"; }
[ -z "$TSV" ] || : > "$TSV"

if [ -n "$TORCH_PY" ]; then
    for mode in $MODES; do
        one "$mode" "$N1" & one "$mode" "$N2"; wait
    done
    echo "| mode | per tensor (alloc + free), allocating thread | added over untraced | share of \`_record_memory_history(stacks=\"python\")\`'s | drain thread, added | collector | \`run\`'s replay at exit |"
    echo "|---|---:|---:|---:|---:|---:|---:|"
    base=$(per untraced "$N1" "$N2" program)
    others=$(per untraced "$N1" "$N2" program-others)
    hist=
    case " $MODES " in *" history-python "*) hist=$(( $(per history-python "$N1" "$N2" program) - base )) ;; esac
    for mode in $MODES; do
        p=$(per "$mode" "$N1" "$N2" program)
        added=$(( p - base ))
        share=-
        [ -z "$hist" ] || share=$(python3 -c "print(f'{$added / $hist:.2f}x')")
        drain=$(( $(per "$mode" "$N1" "$N2" program-others) - others ))
        coll=$(per "$mode" "$N1" "$N2" collector)
        replay=$(per "$mode" "$N1" "$N2" run)
        echo "| $mode | $p | $added | $share | $drain | $coll | $replay |"
        tsv "$mode" thread "$p"; tsv "$mode" added "$added"; tsv "$mode" drain "$drain"
        tsv "$mode" collector "$coll"; tsv "$mode" replay "$replay"
    done
    echo
fi
P1=20000 P2=80000
for mode in pairs-untraced pairs-events pairs-stacks; do
    one "$mode" "$P1" & one "$mode" "$P2"; wait
done
echo "| mode (bench_pairs, 30 frames deep, no frame pointers) | per pair (cudaMalloc + cudaFree), the program's thread | added over untraced | drain thread, added | collector | \`run\`'s replay at exit |"
echo "|---|---:|---:|---:|---:|---:|"
base=$(per pairs-untraced "$P1" "$P2" program)
others=$(per pairs-untraced "$P1" "$P2" program-others)
for mode in pairs-untraced pairs-events pairs-stacks; do
    p=$(per "$mode" "$P1" "$P2" program)
    drain=$(( $(per "$mode" "$P1" "$P2" program-others) - others ))
    coll=$(per "$mode" "$P1" "$P2" collector)
    replay=$(per "$mode" "$P1" "$P2" run)
    echo "| $mode | $p | $(( p - base )) | $drain | $coll | $replay |"
    tsv "$mode" thread "$p"; tsv "$mode" added "$(( p - base ))"; tsv "$mode" drain "$drain"
    tsv "$mode" collector "$coll"; tsv "$mode" replay "$replay"
done
