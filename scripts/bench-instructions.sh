#!/usr/bin/env bash
# Per-tensor and per-pair cost in instructions (valgrind's callgrind), which do not depend on
# what else the machine runs: the figures of scripts/bench.sh that a shared 2-core machine
# cannot make swing. For each mode, the allocating thread's instructions over a run of N1 and
# of N2 tensors (bench-torch.py, one round); (I(N2) - I(N1)) / (N2 - N1) is the cost of one
# tensor (alloc + free), start-up and import cancelling out. The same for cudaMalloc+cudaFree
# pairs from C (bench_pairs, 30 frames deep without frame pointers; 20,000 and 80,000 pairs).
# Prints two Markdown tables.
# Usage: scripts/bench-instructions.sh [N1 N2]   (default 1000 4000; about 4 minutes a run,
# two runs at a time). Needs valgrind (Debian: valgrind) and the test tier's PyTorch venv
# (without it, the per-pair table only).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
N1=${1:-1000}
N2=${2:-4000}
command -v valgrind >/dev/null || { echo "bench-instructions: valgrind is needed (apt-get install valgrind)" >&2; exit 1; }
TORCH_PY=$(scripts/torch-env.sh 2>/dev/null) || TORCH_PY=
BUILD_OUT=$(ls -t target/release/build/oomtrace-tests-*/output | head -1)
SIM=$(grep -o 'OOMTRACE_SIM_LIB=.*' "$BUILD_OUT" | cut -d= -f2)
BIN=$(grep -o 'OOMTRACE_SCENARIO_BIN=.*' "$BUILD_OUT" | cut -d= -f2)
WORK=$(mktemp -d -t oomtrace-instr-XXXXXX)
trap 'rm -rf "$WORK"' EXIT

# One run: MODE N -> $WORK/MODE.N.cg (one file per thread; -01 is the main thread).
one() {
    local mode=$1 n=$2 out=$WORK/$1.$2
    local vg="valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file=$out.cg"
    local run="env OOMTRACE_LIB=$ROOT/target/release/liboomtrace.so $ROOT/target/release/oomtrace run -o $out.oomt --"
    local b="$TORCH_PY $ROOT/scripts/bench-torch.py $n"
    (
        export LD_LIBRARY_PATH=$SIM CUDA_MODULE_LOADING=LAZY ROUNDS=1 PYTHONHASHSEED=0
        case $mode in
            untraced) setarch -R $vg $b ;;
            methods) setarch -R $run $vg $b ;;
            trace-tracker) OOMTRACE_TORCH_ENTRY=tracker setarch -R $run $vg $b ;;
            history-python) BENCH_RECORD_HISTORY=python setarch -R $vg $b ;;
            pairs-untraced) $vg "$BIN/bench_pairs" "$n" 1 ;;
            pairs-events) OOMTRACE_STACKS=off $run $vg "$BIN/bench_pairs" "$n" 1 ;;
            pairs-stacks) $run $vg "$BIN/bench_pairs" "$n" 1 ;;
        esac
    ) >"$out.log" 2>&1
}
main_thread() { sed -n 's/^summary: //p' "$WORK/$1.$2.cg-01"; }

per() { echo $(( ($(main_thread "$1" "$3") - $(main_thread "$1" "$2")) / ($3 - $2) )); }
if [ -n "$TORCH_PY" ]; then
    MODES="untraced methods trace-tracker history-python"
    for mode in $MODES; do
        one "$mode" "$N1" & one "$mode" "$N2"; wait
    done
    echo "| mode | instructions per tensor (alloc + free), allocating thread | added over untraced | share of \`_record_memory_history(stacks=\"python\")\`'s |"
    echo "|---|---:|---:|---:|"
    base=$(per untraced "$N1" "$N2")
    hist=$(( $(per history-python "$N1" "$N2") - base ))
    for mode in $MODES; do
        p=$(per "$mode" "$N1" "$N2")
        added=$(( p - base ))
        share=$(python3 -c "print(f'{$added / $hist:.2f}x')")
        echo "| $mode | $p | $added | $share |"
    done
    echo
fi
P1=20000 P2=80000
for mode in pairs-untraced pairs-events pairs-stacks; do
    one "$mode" "$P1" & one "$mode" "$P2"; wait
done
echo "| mode (bench_pairs, 30 frames deep, no frame pointers) | instructions per pair (cudaMalloc + cudaFree), the program's thread | added over untraced |"
echo "|---|---:|---:|"
base=$(per pairs-untraced "$P1" "$P2")
for mode in pairs-untraced pairs-events pairs-stacks; do
    p=$(per "$mode" "$P1" "$P2")
    echo "| $mode | $p | $(( p - base )) |"
done
