"""Sums up bench_step.py results for scripts/gpu-check.sh (check d).

    bench_summary.py DIR TORCH_STATE

DIR holds MODE.ROUND.json files (modes: untraced, shim, torch, history). Each mode's figure
is the median of its rounds' median step times. Writes DIR/bench.md (a Markdown table) and
prints one tab-separated verdict line per check: STATUS, id, title, detail. TORCH_STATE is
"ok" or "unavailable" (oomtrace run --torch refused by this build).
Targets (docs/targets.md): shim <= 1 % slower than untraced; --torch faster than
_record_memory_history.
"""

import glob
import json
import os
import statistics
import sys

LABELS = {
    "untraced": "untraced",
    "shim": "LD_PRELOAD=liboomtrace.so",
    "torch": "oomtrace run --torch",
    "history": "untraced + _record_memory_history(max_entries=100000)",
}


def main():
    d, torch_state = sys.argv[1], sys.argv[2]
    rounds = {}
    for path in sorted(glob.glob(os.path.join(d, "*.*.json"))):
        mode = os.path.basename(path).split(".")[0]
        try:
            with open(path) as fh:
                rounds.setdefault(mode, []).append(json.load(fh)["median_ms"])
        except (OSError, ValueError, KeyError):
            pass
    med = {m: statistics.median(v) for m, v in rounds.items() if v}
    base = med.get("untraced")

    rows = ["| configuration | median step (ms) | rounds (ms) | vs untraced |",
            "|---|---|---|---|"]
    for m, label in LABELS.items():
        if m not in med:
            note = "not available in this build" if m == "torch" and torch_state != "ok" else "no result"
            rows.append(f"| {label} | — | — | {note} |")
            continue
        ratio = f"{med[m] / base:.3f}x" if base else "—"
        rs = ", ".join(f"{x:.2f}" for x in rounds[m])
        rows.append(f"| {label} | {med[m]:.2f} | {rs} | {ratio} |")
    with open(os.path.join(d, "bench.md"), "w") as fh:
        fh.write("\n".join(rows) + "\n")

    def verdict(status, cid, title, detail):
        print(f"{status}\t{cid}\t{title}\t{detail}")

    t = "overhead: LD_PRELOAD shim <= 1% slower than untraced"
    if base is None or "shim" not in med:
        verdict("FAIL", "d-shim", t, "no result for " + ("untraced" if base is None else "shim"))
    else:
        r = med["shim"] / base
        verdict("PASS" if r <= 1.01 else "FAIL", "d-shim", t,
                f"{med['shim']:.2f} ms vs {base:.2f} ms untraced = {r:.3f}x (target <= 1.010x)")

    t = "overhead: oomtrace run --torch faster than _record_memory_history"
    if torch_state != "ok":
        verdict("SKIP", "d-torch", t, "oomtrace run --torch is not available in this build"
                + (f"; _record_memory_history = {med['history'] / base:.3f}x untraced"
                   if base and "history" in med else ""))
    elif "torch" not in med or "history" not in med or base is None:
        missing = [m for m in ("untraced", "torch", "history") if m not in med]
        verdict("FAIL", "d-torch", t, "no result for " + ", ".join(missing))
    else:
        rt, rh = med["torch"] / base, med["history"] / base
        verdict("PASS" if med["torch"] < med["history"] else "FAIL", "d-torch", t,
                f"--torch {med['torch']:.2f} ms ({rt:.3f}x) vs _record_memory_history "
                f"{med['history']:.2f} ms ({rh:.3f}x), untraced {base:.2f} ms")


if __name__ == "__main__":
    main()
