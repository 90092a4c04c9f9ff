#!/usr/bin/env bash
# Every benchmark of docs/targets.md in one run, printed as one Markdown table: each figure beside
# its target and the baseline measured in the same run. Not part of the default test run
# (it takes a few minutes). Usage: scripts/bench.sh > bench/$(date +%F)-table.md
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q
cargo build --release -q -p oomtrace-tests --benches
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

echo "# oomtrace benchmarks — $(date +%F)"
echo
echo "Machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(uname -sr), $(rustc --version)."
echo "Command: \`scripts/bench.sh\`. No GPU: the simulated CUDA stands in for the driver."
echo

# Hook cost (forward / events / native stacks), its own table.
cargo bench -q -p oomtrace-tests --bench hook > "$WORK/hook.txt" 2>/dev/null
# Collector figures: metric, value, baseline, target (tab-separated).
cargo bench -q -p oomtrace-tests --bench ingest > "$WORK/ingest.txt" 2>/dev/null

# Shim memory over ~10^8 events: bench_pairs (3 passes of N pairs, 2 events each) traced,
# against the same program untraced; max RSS of the program from /usr/bin/time.
# The build script's output of the current build (older build directories may linger).
OUT=$(ls -t target/release/build/oomtrace-tests-*/output | head -1)
BIN=$(grep -o 'OOMTRACE_SCENARIO_BIN=.*' "$OUT" | cut -d= -f2)
SIM=$(grep -o 'OOMTRACE_SIM_LIB=.*' "$OUT" | cut -d= -f2)
PAIRS=${PAIRS_FOR_MEMORY:-16700000}
LD_LIBRARY_PATH=$SIM /usr/bin/time -f "%M" -o "$WORK/base.rss" "$BIN/bench_pairs" "$PAIRS" > /dev/null
( cd "$WORK" && LD_LIBRARY_PATH=$SIM LD_PRELOAD="$OLDPWD/target/release/liboomtrace.so" \
    OOMTRACE_COLLECTOR="$OLDPWD/target/release/oomtrace" OOMTRACE_OUTPUT="$WORK/mem2.oomt" \
    /usr/bin/time -f "%M" -o "$WORK/shim.rss" "$BIN/bench_pairs" "$PAIRS" > /dev/null )
# Python frames: the same pairs from CPython through ctypes, 20 Python frames deep, untraced,
# traced with native stacks only, and traced with Python frames (median of 5 rounds each).
pybench() { LD_LIBRARY_PATH=$SIM "$@" python3 scripts/bench-python.py 100000 2>/dev/null | awk '{print $2}'; }
PY_BASE=$(pybench env)
PY_NATIVE=$(pybench env OOMTRACE_PYTHON=0 OOMTRACE_LIB=target/release/liboomtrace.so target/release/oomtrace run -o "$WORK/py1.oomt" --)
PY_FRAMES=$(pybench env OOMTRACE_LIB=target/release/liboomtrace.so target/release/oomtrace run -o "$WORK/py2.oomt" --)
echo "$PY_BASE $PY_NATIVE $PY_FRAMES" > "$WORK/python.txt"
# Real PyTorch (the test tier's venv, scripts/torch-env.sh) on simcuda: per-tensor cost of
# the default and --torch (the same trace tracker), --torch=swap and PyTorch's own _record_memory_history beside
# untraced, in this run. Kernels are
# no-ops there: host-side cost only. Address-space randomisation off, as in the tests.
TORCH_PY=$(scripts/torch-env.sh)
torchbench() { LD_LIBRARY_PATH=$SIM CUDA_MODULE_LOADING=LAZY setarch -R "$@" "$TORCH_PY" scripts/bench-torch.py 20000 2>/dev/null | awk '/ns_per_tensor/ {print $2}'; }
T_BASE=$(torchbench env)
T_HISTORY=$(torchbench env BENCH_RECORD_HISTORY=1)
T_TORCH=$(torchbench env OOMTRACE_LIB=target/release/liboomtrace.so target/release/oomtrace run --torch -o "$WORK/torch.oomt" --)
T_SWAP=$(torchbench env OOMTRACE_LIB=target/release/liboomtrace.so target/release/oomtrace run --torch=swap -o "$WORK/swap.oomt" --)
T_DEFAULT=$(torchbench env OOMTRACE_LIB=target/release/liboomtrace.so target/release/oomtrace run -o "$WORK/default.oomt" --)
echo "$T_BASE $T_HISTORY $T_TORCH $T_SWAP $T_DEFAULT" > "$WORK/torch.txt"
EVENTS=$(target/release/oomtrace report --json "$WORK/mem2.oomt" | python3 -c 'import json,sys; print(json.load(sys.stdin)["processes"][0]["events"])')

python3 - "$WORK" "$EVENTS" <<'PY'
import re, sys
work, events = sys.argv[1], int(sys.argv[2])
rows = []
hook = open(f"{work}/hook.txt").read()
base = None
for m in re.finditer(r"^\| (baseline|forward|events|stacks) \| ([\d.]+) \| ([^|]+)\|", hook, re.M):
    mode, ns, delta = m.group(1), float(m.group(2)), m.group(3).strip()
    if mode == "baseline":
        base = ns
        continue
    name = {"forward": "hook, forward only", "events": "hook, events without stacks",
            "stacks": "hook, native stacks (30 frames, no frame pointers)"}[mode]
    target = "<= 1000 ns" if mode == "stacks" else "-"
    rows.append((name + ", per alloc+free pair", delta, f"{base:.1f} ns/pair untraced", f"{ns/base:.2f}x", target))
py_base, py_native, py_frames = map(float, open(f"{work}/python.txt").read().split())
t_base, t_history, t_torch, t_swap, t_default = map(float, open(f"{work}/torch.txt").read().split())
rows.append(("real PyTorch 2.15 on simcuda, per tensor alloc+free: `oomtrace run --torch` (trace tracker; host cost; kernels are no-ops)",
             f"{t_torch:.0f} ns", f"{t_base:.0f} ns untraced", f"{t_torch/t_base:.2f}x", "-"))
rows.append(("real PyTorch 2.15 on simcuda, per tensor alloc+free: `oomtrace run` (the default: the same tracker)",
             f"{t_default:.0f} ns", f"{t_base:.0f} ns untraced", f"{t_default/t_base:.2f}x", "<= --torch"))
rows.append(("real PyTorch 2.15 on simcuda, per tensor alloc+free: `oomtrace run --torch=swap` (pluggable allocator)",
             f"{t_swap:.0f} ns", f"{t_base:.0f} ns untraced", f"{t_swap/t_base:.2f}x", "-"))
rows.append(("real PyTorch 2.15 on simcuda, per tensor alloc+free: `_record_memory_history` (PyTorch's own)",
             f"{t_history:.0f} ns", f"{t_base:.0f} ns untraced", f"{t_history/t_base:.2f}x", "-"))
rows.append(("hook from CPython (ctypes, 20 Python frames), native stacks, per pair",
             f"+{py_native - py_base:.0f} ns", f"{py_base:.0f} ns/pair untraced", f"{py_native/py_base:.2f}x", "-"))
rows.append(("hook, Python frames on top of native stacks, per alloc event",
             f"+{py_frames - py_native:.0f} ns", f"{py_native:.0f} ns/pair native only", f"{py_frames/py_native:.2f}x",
             "<= 2000 ns per event"))
for line in open(f"{work}/ingest.txt"):
    parts = line.rstrip("\n").split("\t")
    if len(parts) != 4:
        continue
    metric, value, baseline, target = parts
    try:
        ratio = f"{float(value)/float(baseline):.2f}x"
    except ValueError:
        ratio = "-"
    rows.append((metric.replace("_", " "), value, baseline, ratio, target))
b = int(open(f"{work}/base.rss").read().split()[-1])
s = int(open(f"{work}/shim.rss").read().split()[-1])
rows.append((f"shim: program peak RSS over {events:,} events (KiB)", str(s), f"{b} untraced", f"{s/b:.2f}x", "bounded (queue + stack tables)"))
print("| figure | measured | baseline (same run) | ratio | target |")
print("|---|---:|---:|---:|---|")
for r in rows:
    print("| " + " | ".join(r) + " |")
print()
print("<details><summary>hook bench output</summary>\n\n" + hook + "\n</details>")
PY
