#!/usr/bin/env bash
# Per-tensor cost on real PyTorch in instructions (valgrind's callgrind), which do not depend
# on what else the machine runs: the one figure of scripts/bench.sh that a shared 2-core
# machine cannot make swing. For each mode, the allocating thread's instructions over a run of
# N1 and of N2 tensors (bench-torch.py, one round); (I(N2) - I(N1)) / (N2 - N1) is the cost of
# one tensor (alloc + free), start-up and import cancelling out. Prints a Markdown table.
# Usage: scripts/bench-instructions.sh [N1 N2]   (default 1000 4000; about 4 minutes a run,
# two runs at a time). Needs valgrind (Debian: valgrind) and the test tier's PyTorch venv.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
N1=${1:-1000}
N2=${2:-4000}
command -v valgrind >/dev/null || { echo "bench-instructions: valgrind is needed (apt-get install valgrind)" >&2; exit 1; }
TORCH_PY=$(scripts/torch-env.sh)
BUILD_OUT=$(ls -t target/release/build/oomtrace-tests-*/output | head -1)
SIM=$(grep -o 'OOMTRACE_SIM_LIB=.*' "$BUILD_OUT" | cut -d= -f2)
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
        esac
    ) >"$out.log" 2>&1
}
main_thread() { sed -n 's/^summary: //p' "$WORK/$1.$2.cg-01"; }

MODES="untraced methods trace-tracker history-python"
for mode in $MODES; do
    one "$mode" "$N1" & one "$mode" "$N2"; wait
done
echo "| mode | instructions per tensor (alloc + free), allocating thread | added over untraced | share of \`_record_memory_history(stacks=\"python\")\`'s |"
echo "|---|---:|---:|---:|"
per() { echo $(( ($(main_thread "$1" "$N2") - $(main_thread "$1" "$N1")) / (N2 - N1) )); }
base=$(per untraced)
hist=$(( $(per history-python) - base ))
for mode in $MODES; do
    p=$(per "$mode")
    added=$(( p - base ))
    share=$(python3 -c "print(f'{$added / $hist:.2f}x')")
    echo "| $mode | $p | $added | $share |"
done
