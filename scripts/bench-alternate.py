#!/usr/bin/env python3
"""Run benchmark modes in alternation and keep every run's numbers.

On a shared machine a single run's figure swings by 2x as other work comes and goes; two
modes run minutes apart compare the machine's moods, not the modes. So each round runs every
mode once, the order rotated by one each round (every mode takes every place in turn, and no
mode always follows the same other), optionally shuffled instead (--shuffle SEED). A mode's
figure is then the median over rounds, and its cost the median over rounds of the difference
to the baseline's run in the same round (scripts/bench-table.py does that arithmetic).

  bench-alternate.py --runs 5 --json out.json --mode untraced 'prog 1000' --mode traced 'oomtrace run -- prog 1000'

Each command runs through `bash -c` (so `VAR=value cmd` and redirections work), with `{run}`
replaced by the round's number (for per-run output paths). Every `key number` pair on a line of
its standard output is kept (`ns_per_pair 812.5`, or `seconds 1.5 cpu 1.4 events 5000000`),
plus `run_seconds`: the whole command's wall time, and `load1`: the 1-minute load average when
it started. A command that fails stops the benchmark with one line naming the mode.
Writes {"modes": [...], "runs": [{"round", "place", "mode", "values"}...], "load_before",
"load_after"} to --json and a summary (per mode, the median of each key) to stderr.
"""
import argparse
import json
import random
import statistics
import subprocess
import sys
import time


def loadavg():
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def numbers(text):
    """Every `key number` pair of every line: the keys a benchmark prints."""
    values = {}
    for line in text.splitlines():
        tokens = line.replace(":", " ").split()
        for key, value in zip(tokens, tokens[1:]):
            try:
                values[key] = float(value)
            except ValueError:
                pass
    return values


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="rounds; every mode runs once per round")
    ap.add_argument("--mode", nargs=2, action="append", metavar=("NAME", "COMMAND"), required=True)
    ap.add_argument("--json", required=True, help="where the runs' numbers go")
    ap.add_argument("--shuffle", type=int, metavar="SEED", help="random order per round instead of rotation")
    ap.add_argument("--timeout", type=float, default=None, help="seconds one command may take")
    args = ap.parse_args()
    names = [name for name, _ in args.mode]
    if len(set(names)) != len(names):
        sys.exit(f"bench-alternate: mode names must differ: {names}")
    if args.runs < 1:
        sys.exit(f"bench-alternate: --runs must be at least 1, got {args.runs}")
    rng = random.Random(args.shuffle)
    out = {"modes": names, "runs": [], "load_before": loadavg()}
    for rnd in range(args.runs):
        order = list(range(len(args.mode)))
        if args.shuffle is not None:
            rng.shuffle(order)
        else:
            order = order[rnd % len(order):] + order[: rnd % len(order)]
        for place, m in enumerate(order):
            name, command = args.mode[m]
            load1 = loadavg()[0]
            start = time.perf_counter()
            try:
                done = subprocess.run(["bash", "-c", command.replace("{run}", str(rnd))],
                                      capture_output=True, text=True, timeout=args.timeout)
            except subprocess.TimeoutExpired:
                sys.exit(f"bench-alternate: mode {name} ran past {args.timeout} s: {command}")
            seconds = time.perf_counter() - start
            if done.returncode != 0:
                tail = " | ".join(done.stderr.strip().splitlines()[-3:]) or "(nothing on stderr)"
                sys.exit(f"bench-alternate: mode {name} exited {done.returncode}: {tail}")
            values = numbers(done.stdout)
            values["run_seconds"] = seconds
            values["load1"] = load1
            out["runs"].append({"round": rnd, "place": place, "mode": name, "values": values})
    out["load_after"] = loadavg()
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    for name in names:
        runs = [r["values"] for r in out["runs"] if r["mode"] == name]
        keys = sorted(set().union(*runs))
        summary = ", ".join(f"{k} {statistics.median(r[k] for r in runs if k in r):.6g}" for k in keys)
        print(f"{name}: {summary}", file=sys.stderr)


if __name__ == "__main__":
    main()
