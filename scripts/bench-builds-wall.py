#!/usr/bin/env python3
"""Wall time of `oomtrace run` of the two-site loop under several builds of liboomtrace.so,
alternated: each round runs the untraced loop and every (build, mode) once, the order rotated
each round, the same `oomtrace` binary throughout (only OOMTRACE_LIB differs). Prints per mode
the median wall time, its ratio to the untraced run's, the median of each round's ratio, and
the median CPU time of the program's own thread (as `two_sites` prints it). Made to compare
builds of the shim on one machine (bench/2026-12-05-events-in-registers.md); copy each build's
target/release/liboomtrace.so aside first.

Usage: scripts/bench-builds-wall.py EVENTS ROUNDS MODES NAME=LIB [NAME=LIB ...]
  MODES: comma-separated, of `events` (OOMTRACE_STACKS=off) and `stacks` (the default).
Needs a release build (cargo build --release): its oomtrace, simcuda and scenario binaries.
"""
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build_paths():
    outs = sorted(ROOT.glob("target/release/build/oomtrace-tests-*/output"),
                  key=lambda p: p.stat().st_mtime, reverse=True)
    if not outs:
        sys.exit("bench-builds-wall: no release build (cargo build --release)")
    text = outs[0].read_text()
    sim = re.search(r"OOMTRACE_SIM_LIB=(\S+)", text).group(1)
    bins = re.search(r"OOMTRACE_SCENARIO_BIN=(\S+)", text).group(1)
    return sim, bins


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__.split("\n\n")[1])
    events, rounds, modes_arg = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
    if any(m not in ("events", "stacks") for m in modes_arg):
        sys.exit(f"bench-builds-wall: unknown mode in {sys.argv[3]!r} (events, stacks)")
    libs = {}
    for a in sys.argv[4:]:
        name, _, lib = a.partition("=")
        if not name or not Path(lib).is_file():
            sys.exit(f"bench-builds-wall: {a!r} is not NAME=LIB with LIB a file")
        libs[name] = str(Path(lib).resolve())
    sim, bins = build_paths()
    modes = ["untraced"] + [f"{k}-{m}" for k in libs for m in modes_arg]
    wall = {m: [] for m in modes}
    cpu = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as d:
        trace = os.path.join(d, "t.oomt")
        for r in range(rounds):
            for m in modes[r % len(modes):] + modes[:r % len(modes)]:
                env = dict(os.environ, LD_LIBRARY_PATH=sim)
                loop = [f"{bins}/two_sites", events]
                if m == "untraced":
                    cmd = loop
                else:
                    name, mode = m.rsplit("-", 1)
                    env["OOMTRACE_LIB"] = libs[name]
                    if mode == "events":
                        env["OOMTRACE_STACKS"] = "off"
                    cmd = [str(ROOT / "target/release/oomtrace"), "run", "-o", trace, "--"] + loop
                t = time.perf_counter()
                p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
                wall[m].append(time.perf_counter() - t)
                if p.returncode != 0:
                    sys.exit(f"bench-builds-wall: {m} exited with {p.returncode}")
                c = re.search(rb"cpu ([0-9.]+)", p.stdout)
                cpu[m].append(float(c.group(1)) if c else float("nan"))
                if os.path.exists(trace):
                    os.unlink(trace)
    base = statistics.median(wall["untraced"])
    print("| mode | median wall | ratio of medians | median round ratio | program thread CPU |")
    print("|---|---:|---:|---:|---:|")
    for m in modes:
        med = statistics.median(wall[m])
        ratios = [a / b for a, b in zip(wall[m], wall["untraced"])]
        print(f"| {m} | {med:.3f} s | {med / base:.3f}x | {statistics.median(ratios):.3f}x "
              f"| {statistics.median(cpu[m]):.3f} s |")
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
