#!/usr/bin/env bash
# The check on a real NVIDIA GPU (docs/real-pytorch.md says what runs without one): PyTorch, nvcc and the driver, no Rust toolchain
# and no network. The binaries are built elsewhere and carried over:
#
#   OOMTRACE_BIN=path/oomtrace OOMTRACE_LIB=path/liboomtrace.so OUT=dir scripts/gpu-check.sh [a] [b] [c] [d] [e]
#
# Defaults: target/release/oomtrace and target/release/liboomtrace.so under the repository
# root, OUT=./gpu-check-out, every check. Helpers live in scripts/gpu/.
#   a  PyTorch loop with a planted leak (scripts/gpu/train_leak.py, line marked LEAK HERE):
#      plain LD_PRELOAD, `oomtrace run` (both trace tensors by default) and `oomtrace run
#      --torch` name the line; the same loop with --clean under --torch must report no leak.
#      Informational extras: no step markers, the clean loop under plain LD_PRELOAD, and
#      `oomtrace run --segments` (the caching allocator's segments only).
#   b  the leak with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (cuMemCreate/cuMemMap).
#   c  an nvcc-built extension (static cudart, dlopen RTLD_LOCAL via ctypes) leaking 4 MiB per
#      leaky_step(); the leak must name leaky_step.
#   d  overhead: median step time untraced, under the shim with segments only
#      (OOMTRACE_TORCH=segments), under --torch (tensors: the default) and with
#      torch.cuda.memory._record_memory_history; ratios against untraced (docs/targets.md).
#   e  fragmentation and whatif: tests/scenarios/torch/growing_shapes.py untraced under the
#      default setting and expandable_segments:True (PyTorch's own max_memory_reserved()), once
#      traced: a fragmentation finding, no leak, and `oomtrace whatif` within 10 % of each.
# Writes OUT/summary.md (date, GPU, versions, one PASS/FAIL/SKIP/INFO line per check), one
# directory per check (stdout, stderr, trace, report.json, the judge's account, and
# stderr-tail.txt when it failed). Every command runs under `timeout` (GPU_CHECK_TIMEOUT s,
# default 300). Exit: 0 all checks passed (SKIP and INFO do not count), 1 a check failed,
# 2 the machine cannot run the checks (no PyTorch/CUDA, binaries missing).
# Other knobs: PYTHON (default python3), NVCC (default nvcc on PATH, then
# /usr/local/cuda/bin/nvcc), BENCH_ROUNDS (default 3).
set -u

REPO=$(cd "$(dirname "$0")/.." && pwd)
GPU=$REPO/scripts/gpu
PY=${PYTHON:-python3}
T=${GPU_CHECK_TIMEOUT:-300}
ROUNDS=${BENCH_ROUNDS:-3}

abspath() {
    case $1 in
        /*) printf '%s\n' "$1" ;;
        *) printf '%s/%s\n' "$PWD" "$1" ;;
    esac
}
die2() {
    echo "gpu-check: $*" >&2
    exit 2
}

if [ -n "${OOMTRACE_BIN:-}" ]; then BIN=$(abspath "$OOMTRACE_BIN"); else BIN=$REPO/target/release/oomtrace; fi
if [ -n "${OOMTRACE_LIB:-}" ]; then LIB=$(abspath "$OOMTRACE_LIB"); else LIB=$REPO/target/release/liboomtrace.so; fi
OUT=$(abspath "${OUT:-./gpu-check-out}")

CHECKS=${*:-a b c d e}
for c in $CHECKS; do
    case $c in a | b | c | d | e) ;; *) die2 "unknown check '$c' (choose from a b c d e)" ;; esac
done

# --- prerequisites: one line and exit 2 when this machine cannot run the checks -----------
command -v "$PY" > /dev/null 2>&1 || die2 "$PY not found"
"$PY" -c 'import torch' > /dev/null 2>&1 || die2 "PyTorch is not installed for $PY; nothing to check"
"$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' > /dev/null 2>&1 ||
    die2 "PyTorch sees no CUDA device (torch.cuda.is_available() is False)"
command -v timeout > /dev/null 2>&1 || die2 "timeout (coreutils) not found"
[ -x "$BIN" ] || die2 "oomtrace binary not found at $BIN (set OOMTRACE_BIN)"
[ -f "$LIB" ] || die2 "liboomtrace.so not found at $LIB (set OOMTRACE_LIB)"
"$BIN" --help > /dev/null 2>&1 || die2 "$BIN does not run on this machine: $("$BIN" --help 2>&1 | head -1)"
export OOMTRACE_LIB=$LIB       # for `oomtrace run`
export OOMTRACE_COLLECTOR=$BIN # for the plain-LD_PRELOAD shim's own collector

NVCC=${NVCC:-}
if [ -z "$NVCC" ]; then
    if command -v nvcc > /dev/null 2>&1; then
        NVCC=$(command -v nvcc)
    elif [ -x /usr/local/cuda/bin/nvcc ]; then NVCC=/usr/local/cuda/bin/nvcc; fi
fi

mkdir -p "$OUT" || die2 "cannot create $OUT"
RESULTS=$OUT/results.tsv
: > "$RESULTS"
FAILS=0
START=$(date +%s)

# --- plumbing ----------------------------------------------------------------------------
# result STATUS ID TITLE DETAIL: one line in results.tsv and on stderr; a FAIL keeps the tail
# of the check's stderr in OUT/ID/stderr-tail.txt.
result() {
    local status=$1 id=$2 title=$3 detail=$4
    printf '%s\t%s\t%s\t%s\n' "$status" "$id" "$title" "$detail" >> "$RESULTS"
    printf 'gpu-check: %-4s %s: %s\n' "$status" "$id" "$detail" >&2
    if [ "$status" = FAIL ]; then
        FAILS=$((FAILS + 1))
        if [ -d "$OUT/$id" ]; then
            local f
            : > "$OUT/$id/stderr-tail.txt"
            for f in "$OUT/$id"/*stderr*.txt "$OUT/$id/judge.txt"; do
                { [ -f "$f" ] && [ "$f" != "$OUT/$id/stderr-tail.txt" ]; } || continue
                { echo "==> ${f##*/} <=="; tail -n 40 "$f"; } >> "$OUT/$id/stderr-tail.txt"
            done
            sed 's/^/    | /' "$OUT/$id/stderr-tail.txt" >&2
        fi
    fi
}

# run_in DIR [NAME] -- CMD...: run CMD in DIR under timeout, stdout/stderr to DIR/NAME.stdout.txt
# and DIR/NAME.stderr.txt; the exit status in RC.
RC=0
run_in() {
    local dir=$1 name=$2
    shift 3
    (cd "$dir" && exec timeout -k 10 "$T" "$@") > "$dir/$name.stdout.txt" 2> "$dir/$name.stderr.txt"
    RC=$?
}

rc_note() {
    case $1 in
        124 | 137) echo "timed out after ${T}s" ;;
        *) echo "exit code $1" ;;
    esac
}

torch_refused() { # DIR NAME: did `oomtrace run --torch` refuse because this build lacks it?
    [ "$RC" -eq 2 ] && grep -q 'not available' "$1/$2.stderr.txt"
}

# trace_check ID GRADE MODE TITLE JUDGE-ARGS... -- CMD...
#   GRADE: check (counts) | info (reported as INFO, never fails the run)
#   MODE: preload (plain LD_PRELOAD, trace via OOMTRACE_OUTPUT) | run | torch (oomtrace run
#         [--torch]) | segments (oomtrace run --segments)
#   JUDGE-ARGS go to scripts/gpu/check_report.py.
trace_check() {
    local id=$1 grade=$2 mode=$3 title=$4
    shift 4
    local judge=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do
        judge+=("$1")
        shift
    done
    shift
    local dir=$OUT/$id
    rm -rf "$dir"
    mkdir -p "$dir"
    printf '%q ' "$@" > "$dir/command.txt"
    echo "($mode)" >> "$dir/command.txt"
    echo "gpu-check: $id: $title ..." >&2
    case $mode in
        preload) run_in "$dir" prog -- env LD_PRELOAD="$LIB" OOMTRACE_OUTPUT="$dir/trace.oomt" "$@" ;;
        run) run_in "$dir" prog -- "$BIN" run --output "$dir/trace.oomt" --json "$dir/report.json" -- "$@" ;;
        torch) run_in "$dir" prog -- "$BIN" run --torch --output "$dir/trace.oomt" --json "$dir/report.json" -- "$@" ;;
        segments) run_in "$dir" prog -- "$BIN" run --segments --output "$dir/trace.oomt" --json "$dir/report.json" -- "$@" ;;
    esac
    local status detail jrc
    if [ "$mode" = torch ] && torch_refused "$dir" prog; then
        result SKIP "$id" "$title" "oomtrace run --torch is not available in this build: $(grep -m1 'not available' "$dir/prog.stderr.txt")"
        return
    fi
    if [ "$RC" -ne 0 ]; then
        status=FAIL
        [ "$grade" = info ] && status=INFO
        result "$status" "$id" "$title" "the traced program failed: $(rc_note "$RC")"
        return
    fi
    if [ ! -s "$dir/report.json" ]; then
        if [ ! -s "$dir/trace.oomt" ]; then
            local other
            other=$(find "$dir" -maxdepth 1 -name '*.oomt' | head -1)
            if [ -z "$other" ]; then
                status=FAIL
                [ "$grade" = info ] && status=INFO
                result "$status" "$id" "$title" "no trace file written (expected $dir/trace.oomt)"
                return
            fi
            mv "$other" "$dir/trace.oomt"
        fi
        timeout -k 10 "$T" "$BIN" report --json "$dir/trace.oomt" > "$dir/report.json" 2> "$dir/report.stderr.txt"
    fi
    [ -s "$dir/trace.oomt" ] && timeout -k 10 "$T" "$BIN" report "$dir/trace.oomt" > "$dir/report.txt" 2>&1
    detail=$("$PY" "$GPU/check_report.py" "$dir/report.json" "${judge[@]}" 2> "$dir/judge.txt")
    jrc=$?
    if [ "$jrc" -eq 0 ]; then status=PASS; else status=FAIL; fi
    if [ "$grade" = info ]; then
        detail="(informational, would be $status) $detail"
        status=INFO
    fi
    result "$status" "$id" "$title" "$detail"
}

# --- environment -------------------------------------------------------------------------
env_line() { "$@" 2> /dev/null | head -1; }
DATE=$(date -u '+%Y-%m-%d %H:%M UTC')
GPU_NAME=$(env_line nvidia-smi --query-gpu=name,memory.total --format=csv,noheader)
DRIVER=$(env_line nvidia-smi --query-gpu=driver_version --format=csv,noheader)
CUDA_DRV=$(nvidia-smi 2> /dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -1)
TORCH_VER=$("$PY" -c 'import torch; print(torch.__version__, "(CUDA", str(torch.version.cuda) + ")")' 2> /dev/null)
PY_VER=$("$PY" -c 'import platform; print(platform.python_version())' 2> /dev/null)
NVCC_VER=unavailable
[ -n "$NVCC" ] && NVCC_VER=$("$NVCC" --version 2> /dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p' | head -1)
OOMT_VER=$(env_line "$BIN" --version)
GIT_REV=$(git -C "$REPO" rev-parse --short HEAD 2> /dev/null)
if [ -n "$GIT_REV" ] && [ -n "$(git -C "$REPO" status --porcelain 2> /dev/null | head -1)" ]; then
    GIT_REV="$GIT_REV (with uncommitted changes)"
fi

# --- a: the PyTorch leak -----------------------------------------------------------------
TRAIN=$GPU/train_leak.py
LEAK_LINE=$(grep -n '# LEAK HERE' "$TRAIN" | head -1 | cut -d: -f1)
[ -n "$LEAK_LINE" ] || die2 "no '# LEAK HERE' line in $TRAIN"
LEAK_ARGS=(--expect leak --file train_leak.py --line "$LEAK_LINE")

case " $CHECKS " in *" a "*)
    # Tensors by default: the leaked tensor is allocated on the LEAK HERE line itself.
    trace_check a1-preload check preload "plain LD_PRELOAD: leak at train_leak.py:$LEAK_LINE" \
        "${LEAK_ARGS[@]}" --require-file --strict-line -- "$PY" "$TRAIN"
    trace_check a2-run check run "oomtrace run: leak at train_leak.py:$LEAK_LINE" \
        "${LEAK_ARGS[@]}" --require-file --strict-line -- "$PY" "$TRAIN"
    # Tensor-level: the leaked tensor is allocated on the LEAK HERE line itself.
    trace_check a3-torch check torch "oomtrace run --torch: leak at train_leak.py:$LEAK_LINE" \
        "${LEAK_ARGS[@]}" --require-file --strict-line -- "$PY" "$TRAIN"
    trace_check a4-torch-clean check torch "oomtrace run --torch, --clean loop: no leak reported" \
        --expect noleak -- "$PY" "$TRAIN" --clean
    trace_check a5-preload-nomarks info preload "plain LD_PRELOAD without step markers: leak found" \
        "${LEAK_ARGS[@]}" -- "$PY" "$TRAIN" --no-marks
    trace_check a6-preload-clean info preload "plain LD_PRELOAD, --clean loop: no leak reported" \
        --expect noleak -- "$PY" "$TRAIN" --clean
    # Segment-level (caching allocator): the stack may name the op that made the cache grow;
    # a leak the cache absorbs may go unseen.
    trace_check a7-segments info segments "oomtrace run --segments: leak named in train_leak.py" \
        "${LEAK_ARGS[@]}" --require-file -- "$PY" "$TRAIN"
    ;;
esac

# --- b: expandable segments (VMM) --------------------------------------------------------
case " $CHECKS " in *" b "*)
    trace_check b-expandable check preload "plain LD_PRELOAD, expandable_segments:True: leak found (VMM path)" \
        "${LEAK_ARGS[@]}" --require-vmm -- env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "$PY" "$TRAIN"
    ;;
esac

# --- c: nvcc-built extension, static cudart ----------------------------------------------
case " $CHECKS " in *" c "*)
    title="nvcc extension (static cudart, dlopen RTLD_LOCAL): leak names leaky_step"
    dir=$OUT/c-nvcc
    rm -rf "$dir"
    mkdir -p "$dir"
    if [ -z "$NVCC" ]; then
        result FAIL c-nvcc "build libleaky_ext.so with nvcc" "nvcc not found (set NVCC)"
    else
        echo "gpu-check: c-nvcc: nvcc -shared -Xcompiler -fPIC leaky_ext.cu ..." >&2
        # nvcc's default --cudart static: the runtime is linked into the library.
        run_in "$dir" nvcc -- "$NVCC" -shared -Xcompiler -fPIC -g -o "$dir/libleaky_ext.so" "$GPU/leaky_ext.cu"
        if [ "$RC" -ne 0 ] || [ ! -f "$dir/libleaky_ext.so" ]; then
            result FAIL c-nvcc "build libleaky_ext.so with nvcc" "nvcc failed: $(rc_note "$RC")"
        else
            trace_check c-ext check run "$title" --expect leak --function leaky_step -- \
                "$PY" "$GPU/leaky_host.py" "$dir/libleaky_ext.so" --steps 30
        fi
    fi
    ;;
esac

# --- d: overhead ---------------------------------------------------------------------------
case " $CHECKS " in *" d "*)
    dir=$OUT/d-bench
    rm -rf "$dir" "$OUT/d-shim" "$OUT/d-torch"
    mkdir -p "$dir"
    TORCH_STATE=ok
    BENCH=$GPU/bench_step.py
    for r in $(seq 1 "$ROUNDS"); do
        for mode in untraced shim torch history; do
            echo "gpu-check: d-bench: round $r/$ROUNDS, $mode ..." >&2
            js=$dir/$mode.$r.json
            case $mode in
                untraced) run_in "$dir" "$mode.$r" -- "$PY" "$BENCH" --mode untraced --json-out "$js" ;;
                shim) run_in "$dir" "$mode.$r" -- env LD_PRELOAD="$LIB" OOMTRACE_TORCH=segments OOMTRACE_OUTPUT="$dir/shim.$r.oomt" \
                    "$PY" "$BENCH" --mode shim --json-out "$js" ;;
                torch)
                    [ "$TORCH_STATE" = ok ] || continue
                    run_in "$dir" "$mode.$r" -- "$BIN" run --torch --output "$dir/torch.$r.oomt" -- \
                        "$PY" "$BENCH" --mode torch --json-out "$js"
                    torch_refused "$dir" "$mode.$r" && TORCH_STATE=unavailable
                    ;;
                history) run_in "$dir" "$mode.$r" -- "$PY" "$BENCH" --mode history --record-history --json-out "$js" ;;
            esac
            if [ "$RC" -ne 0 ] && ! { [ "$mode" = torch ] && [ "$TORCH_STATE" != ok ]; }; then
                echo "gpu-check: d-bench: $mode round $r failed: $(rc_note "$RC")" >&2
                tail -n 20 "$dir/$mode.$r.stderr.txt" | sed 's/^/    | /' >&2
            fi
        done
    done
    while IFS=$'\t' read -r status id title detail; do
        [ -n "$status" ] || continue
        # result() takes the stderr tails from OUT/ID: give it the bench runs' stderr.
        if [ "$status" = FAIL ]; then
            mkdir -p "$OUT/$id"
            for f in "$dir"/*.stderr.txt; do
                [ -f "$f" ] && cp "$f" "$OUT/$id/"
            done
        fi
        result "$status" "$id" "$title" "$detail"
    done < <("$PY" "$GPU/bench_summary.py" "$dir" "$TORCH_STATE")
    ;;
esac

# --- e: fragmentation and whatif -----------------------------------------------------------
case " $CHECKS " in *" e "*)
    title="growing_shapes.py: fragmentation, no leak, whatif within 10 % of the GPU's reserve"
    dir=$OUT/e-whatif
    rm -rf "$dir"
    mkdir -p "$dir"
    SCEN=$REPO/tests/scenarios/torch
    echo "gpu-check: e-whatif: $title ..." >&2
    fail=""
    run_in "$SCEN" untraced-default -- env -u PYTORCH_CUDA_ALLOC_CONF STEPS=40 "$PY" growing_shapes.py
    [ "$RC" -eq 0 ] || fail="untraced default run: $(rc_note "$RC")"
    mv "$SCEN"/untraced-default.*.txt "$dir"/ 2> /dev/null
    run_in "$SCEN" untraced-expandable -- env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True STEPS=40 "$PY" growing_shapes.py
    [ "$RC" -eq 0 ] || fail="untraced expandable run: $(rc_note "$RC")"
    mv "$SCEN"/untraced-expandable.*.txt "$dir"/ 2> /dev/null
    run_in "$SCEN" prog -- env -u PYTORCH_CUDA_ALLOC_CONF STEPS=40 "$BIN" run --output "$dir/trace.oomt" --json "$dir/report.json" -- "$PY" growing_shapes.py
    [ "$RC" -eq 0 ] || fail="traced run: $(rc_note "$RC")"
    mv "$SCEN"/prog.*.txt "$dir"/ 2> /dev/null
    if [ -z "$fail" ]; then
        timeout -k 10 "$T" "$BIN" whatif --json "$dir/trace.oomt" > "$dir/whatif-default.json" 2> "$dir/whatif.stderr.txt" &&
            timeout -k 10 "$T" "$BIN" whatif --json --alloc-conf expandable_segments:True "$dir/trace.oomt" > "$dir/whatif-expandable.json" 2>> "$dir/whatif.stderr.txt" ||
            fail="oomtrace whatif failed"
    fi
    if [ -n "$fail" ]; then
        result FAIL e-whatif "$title" "$fail"
    elif detail=$("$PY" "$GPU/check_whatif.py" "$dir" 2> "$dir/judge.txt"); then
        result PASS e-whatif "$title" "$detail"
    else
        result FAIL e-whatif "$title" "$detail"
    fi
    ;;
esac

# --- summary ---------------------------------------------------------------------------------
SUMMARY=$OUT/summary.md
{
    echo "# oomtrace GPU check — $DATE"
    echo
    echo "- GPU: ${GPU_NAME:-unknown} (nvidia-smi)"
    echo "- Driver: ${DRIVER:-unknown}, CUDA (driver): ${CUDA_DRV:-unknown}, nvcc: ${NVCC_VER:-unknown}"
    echo "- PyTorch: ${TORCH_VER:-unknown}, Python ${PY_VER:-unknown}"
    echo "- oomtrace: ${OOMT_VER:-unknown}${GIT_REV:+, tree $GIT_REV}; binary $BIN, shim $LIB"
    echo "- Command: \`scripts/gpu-check.sh $CHECKS\` ($(($(date +%s) - START)) s, timeout ${T}s per command)"
    echo "- LEAK HERE line: train_leak.py:$LEAK_LINE"
    echo
    echo "## Results"
    echo
    while IFS=$'\t' read -r status id title detail; do
        echo "- **$status** \`$id\` — $title: $detail"
    done < "$RESULTS"
    if [ -f "$OUT/d-bench/bench.md" ]; then
        echo
        echo "## Step time (check d; median of $ROUNDS rounds, each the median of 120 steps)"
        echo
        cat "$OUT/d-bench/bench.md"
    fi
    if [ "$FAILS" -gt 0 ]; then
        echo
        echo "## Failures: stderr tails"
        while IFS=$'\t' read -r status id _; do
            t=$OUT/$id/stderr-tail.txt
            { [ "$status" = FAIL ] && [ -f "$t" ]; } || continue
            echo
            echo "### $id"
            echo
            echo '```'
            cat "$t"
            echo '```'
        done < "$RESULTS"
    fi
} > "$SUMMARY"

cat "$SUMMARY"
echo
echo "gpu-check: $FAILS check(s) failed; results in $OUT" >&2
[ "$FAILS" -eq 0 ]
