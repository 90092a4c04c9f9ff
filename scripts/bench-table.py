#!/usr/bin/env python3
"""The table of scripts/bench.sh: every figure beside its baseline from the same run, from the
runs scripts/bench-alternate.py kept (one JSON file per group of modes) and the other
benchmarks' outputs, all in the work directory given as the only argument. Prints Markdown:
the load averages, the table (figure | median | fastest | baseline (same run) |
difference/ratio | target), then every run's raw numbers in a <details>. A group whose file is
missing (skipped by a knob of bench.sh) gives no rows.

Per mode: "median" is the median over the alternated runs of each run's median round,
"fastest" the fastest round of all its runs. A cost is the median over rounds of (mode -
baseline) between the runs of the same round, and, beside it, fastest minus fastest.
"""
import json
import os
import statistics
import sys

work = sys.argv[1]
rows = []
details = []


def path(name):
    return os.path.join(work, name)


class Group:
    """One bench-alternate.py run: per mode, per round, the keys the benchmark printed."""

    def __init__(self, name):
        with open(path(name)) as f:
            self.data = json.load(f)
        self.name = name

    def runs(self, mode):
        return {r["round"]: r["values"] for r in self.data["runs"] if r["mode"] == mode}

    def median(self, mode, key):
        return statistics.median(v[key] for v in self.runs(mode).values())

    def fastest(self, mode, key):
        return min(v[key] for v in self.runs(mode).values())

    def delta(self, mode, base, key):
        """Median over rounds of mode - base in the same round."""
        a, b = self.runs(mode), self.runs(base)
        return statistics.median(a[r][key] - b[r][key] for r in a if r in b)

    def raw(self, title):
        modes = self.data["modes"]
        keys = sorted(set().union(*(r["values"] for r in self.data["runs"])) - {"load1"})
        lines = [f"**{title}** (`{self.name}`; load average before {fmt_load(self.data['load_before'])}, "
                 f"after {fmt_load(self.data['load_after'])})", "",
                 "| round | place | mode | load1 | " + " | ".join(keys) + " |",
                 "|---:|---:|---|---:|" + "---:|" * len(keys)]
        for r in sorted(self.data["runs"], key=lambda r: (r["round"], r["place"])):
            v = r["values"]
            lines.append(f"| {r['round']} | {r['place']} | {r['mode']} | {v['load1']:.2f} | "
                         + " | ".join(f"{v[k]:.6g}" if k in v else "-" for k in keys) + " |")
        details.append("\n".join(lines) + f"\n\nmodes: {', '.join(modes)}\n")


def fmt_load(load):
    return " ".join(f"{x:.2f}" for x in load)


def ns(x):
    return f"{x:,.0f} ns"


def signed_ns(x):
    return f"{x:+,.0f} ns"


def load(name):
    return Group(name) if os.path.exists(path(name)) else None


def cost_rows(g, label, base, base_label, modes, key, fastest_key, targets):
    """Rows of per-operation costs: each mode beside `base`, wall and thread CPU."""
    for clock, k, fk in (("wall", key, fastest_key),
                         ("thread CPU", "cpu_" + key, "fastest_cpu_" + key)):
        bmed, bfast = g.median(base, k), g.fastest(base, fk)
        for mode, name in modes:
            med, fast = g.median(mode, k), g.fastest(mode, fk)
            if mode == base:
                diff = "-"
            else:
                diff = (f"{signed_ns(g.delta(mode, base, k))} (fastest {signed_ns(fast - bfast)}), "
                        f"{med / bmed:.2f}x")
            rows.append((f"{label}: {name}, {clock}", ns(med), ns(fast),
                         f"{ns(bmed)} (fastest {ns(bfast)}) {base_label}", diff,
                         targets.get((mode, clock), targets.get(mode, "-"))))


def share_row(g, label, mode, of, base, key, fastest_key, target):
    """One mode's added cost as a share of another's (both over `base`, same rounds)."""
    for clock, k, fk in (("wall", key, fastest_key),
                         ("thread CPU", "cpu_" + key, "fastest_cpu_" + key)):
        med = ratio(g.delta(mode, base, k), g.delta(of, base, k))
        fast = ratio(g.fastest(mode, fk) - g.fastest(base, fk), g.fastest(of, fk) - g.fastest(base, fk))
        rows.append((f"{label}, {clock}", med, fast, "-", "-", target))


def ratio(a, b):
    """a / b as `0.25x`; "-" where b is no cost at all (noise made it zero or negative)."""
    return f"{a / b:.2f}x" if b > 0 else "-"


# Real PyTorch per tensor.
torch = load("torch.json")
if torch:
    history = "`_record_memory_history(stacks=\"python\")`"
    cost_rows(torch, "per tensor (alloc+free, host cost), real PyTorch on simcuda", "untraced", "untraced",
              [("untraced", "untraced"),
               ("tracker", "`oomtrace run` (the default: the allocator's methods wrapped)"),
               ("trace-tracker", "`oomtrace run`, OOMTRACE_TORCH_ENTRY=tracker (PyTorch's trace tracker)"),
               ("tracker-python", "`oomtrace run`, OOMTRACE_STACKS=python (no native frames)"),
               ("history-python", history),
               ("history-all", "`_record_memory_history(stacks=\"all\")`")],
              "ns_per_tensor", "fastest_ns_per_tensor",
              {"tracker": "<= +300 ns over untraced (issue 24)"})
    share_row(torch, f"per tensor: OOMTRACE_TORCH_ENTRY=tracker's added cost / {history}'s", "trace-tracker",
              "history-python", "untraced", "ns_per_tensor", "fastest_ns_per_tensor", "-")
    share_row(torch, f"per tensor: the default's added cost / {history}'s", "tracker",
              "history-python", "untraced", "ns_per_tensor", "fastest_ns_per_tensor", "<= 0.25x (issue 24)")
    share_row(torch, f"per tensor: OOMTRACE_STACKS=python's added cost / {history}'s", "tracker-python",
              "history-python", "untraced", "ns_per_tensor", "fastest_ns_per_tensor", "-")
    torch.raw("real PyTorch per tensor (scripts/bench-torch.py)")

# Native pairs through the real CLI: the full-speed rows.
native = load("native.json")
if native:
    cost_rows(native, "per pair, C 30 frames deep, no frame pointers (bench_pairs)", "baseline",
              "untraced",
              [("forward", "preloaded, OOMTRACE_DISABLE=1 (interposition alone)"),
               ("events", "`oomtrace run`, OOMTRACE_STACKS=off (events)"),
               ("stacks", "`oomtrace run` (native stacks, the default): the full-speed row")],
              "ns_per_pair", "fastest_ns_per_pair",
              {("stacks", "wall"): "<= +300 ns (issue 24); <= +1000 ns (docs/targets.md)"})
    native.raw("native pairs (tests/scenarios/bench_pairs.c)")

# Python frames through ctypes.
python = load("python.json")
if python:
    cost_rows(python, "per pair from CPython (ctypes, 20 Python frames)", "untraced", "untraced",
              [("native", "`oomtrace run`, OOMTRACE_PYTHON=0 (native stacks only)")],
              "ns_per_pair", "fastest_ns_per_pair", {})
    cost_rows(python, "per pair from CPython (ctypes, 20 Python frames)", "native", "native stacks only",
              [("frames", "`oomtrace run` (Python frames on top of native stacks; one alloc event of the pair carries them)")],
              "ns_per_pair", "fastest_ns_per_pair",
              {("frames", "wall"): "<= +2000 ns per event (docs/targets.md)"})
    python.raw("Python frames (scripts/bench-python.py)")

# End to end: the two-site loop, and the report of its traces.
e2e = load("e2e.json")
if e2e:
    events = e2e.median("untraced", "events")
    base_rate = events / e2e.median("untraced", "run_seconds")
    for mode, name, target in (("off", "OOMTRACE_STACKS=off", "-"),
                               ("stacks", "native stacks (the default)", ">= 5 M events/s (issue 24)")):
        med = events / e2e.median(mode, "run_seconds")
        fast = events / e2e.fastest(mode, "run_seconds")
        rows.append((f"two-site loop, {events:,.0f} events, whole `oomtrace run` (program, drain, collector, trace file), {name}: events/s",
                     f"{med / 1e6:.2f} M/s", f"{fast / 1e6:.2f} M/s", f"{base_rate / 1e6:.2f} M/s untraced",
                     f"{med / base_rate:.2f}x", target))
    for key, what in (("seconds", "wall"), ("cpu", "thread CPU")):
        bmed, bfast = e2e.median("untraced", key), e2e.fastest("untraced", key)
        for mode, name in (("off", "OOMTRACE_STACKS=off"), ("stacks", "native stacks")):
            med, fast = e2e.median(mode, key), e2e.fastest(mode, key)
            rows.append((f"two-site loop, the program's own seconds, {what}, {name}", f"{med:.2f} s", f"{fast:.2f} s",
                         f"{bmed:.2f} s (fastest {bfast:.2f} s) untraced",
                         f"{e2e.delta(mode, 'untraced', key):+.2f} s, {med / bmed:.2f}x", "-"))
    e2e.raw("two-site loop (tests/scenarios/two_sites.c)")
    report = load("report.json")
    if report:
        base = events / report.median("off", "run_seconds")
        med = events / report.median("stacks", "run_seconds")
        fast = events / report.fastest("stacks", "run_seconds")
        rows.append(("`oomtrace report` of the two-site trace with native stacks: events/s",
                     f"{med / 1e6:.2f} M/s", f"{fast / 1e6:.2f} M/s",
                     f"{base / 1e6:.2f} M/s (the OOMTRACE_STACKS=off trace)", f"{med / base:.2f}x",
                     ">= 5 M events/s (issue 24)"))
        report.raw("`oomtrace report` of the last two-site traces")

# Sustained rate: soak paced at increasing rates under `oomtrace run`.
if os.path.exists(path("soak.txt")):
    steps = [line.split() for line in open(path("soak.txt")) if line.strip()]
    full = [float(s[2]) for s in steps if s[0] == "untraced"]
    kept = [float(s[1]) for s in steps if s[0] == "traced" and s[3] == "kept"]
    best = max(kept) if kept else 0.0
    rows.append(("sustained rate the program keeps under `oomtrace run` (soak paced, within 2 %, native stacks): events/s",
                 f"{best / 1e6:.2f} M/s", "-", f"{full[0] / 1e6:.2f} M/s untraced at full speed" if full else "-",
                 f"{best / full[0]:.2f}x" if full else "-", "report (issue 24)"))
    details.append("**sustained rate** (`soak.txt`: mode, requested events/s, achieved events/s, kept/fell behind)\n\n"
                   + "\n".join("    " + " ".join(s) for s in steps) + "\n")

# The collector benchmarks (tests/benches/ingest.rs), one run each.
if os.path.exists(path("ingest.txt")):
    for line in open(path("ingest.txt")):
        parts = line.rstrip("\n").split("\t")
        if len(parts) != 4:
            continue
        metric, value, baseline, target = parts
        try:
            ratio = f"{float(value) / float(baseline):.2f}x"
        except ValueError:
            ratio = "-"
        rows.append((metric.replace("_", " ") + " (one run)", value, "-", baseline, ratio, target))

# Shim memory over ~10^8 events.
if os.path.exists(path("shim.rss")):
    b = int(open(path("base.rss")).read().split()[-1])
    s = int(open(path("shim.rss")).read().split()[-1])
    events = int(open(path("memory-events.txt")).read())
    rows.append((f"shim: program peak RSS over {events:,} events (KiB, one run)", str(s), "-", f"{b} untraced (flat in N)",
                 f"{s / b:.2f}x", "bounded (queue + stack tables)"))

print("| figure | median | fastest | baseline (same run) | difference/ratio | target |")
print("|---|---:|---:|---:|---:|---|")
for r in rows:
    print("| " + " | ".join(r) + " |")
print()
print("<details><summary>every run's numbers</summary>\n")
print("\n".join(details))
if os.path.exists(path("hook.txt")):
    print("**in-process collector** (`cargo bench -p oomtrace-tests --bench hook`)\n")
    print(open(path("hook.txt")).read())
print("</details>")
