"""Judges an `oomtrace report --json` document for scripts/gpu-check.sh.

    check_report.py REPORT --expect leak [--file NAME [--line N] [--require-file [--strict-line]]]
                                         [--function NAME] [--require-vmm]
    check_report.py REPORT --expect noleak

Prints one line (the verdict's detail) on stdout, a longer account of every leak finding on
stderr, and exits 0 (PASS) or 1 (FAIL). Field names: docs/json-report.md (frames are
innermost first; unknown parts are "" / 0).

--expect leak: PASS when some finding has kind "leak" (any level; the level is reported) and
  --function NAME: one of its frames' function contains NAME;
  --file NAME: the first frame in a file whose base name is NAME is reported with its line,
    compared with --line; --require-file: such a frame must exist; --strict-line: its line
    must equal --line;
  --require-vmm: the VMM path of expandable segments was traced: a leak finding's api is
    cuMemCreate/cuMemMap, or some device still reports reserved_va_bytes > 0.
--expect noleak: FAIL when a leak finding has level likely or confirmed (the levels oomtrace
  reports); `suspected` ones are counted in the detail (docs/findings.md: on its own, that is what a
  cache filling up looks like).
"""

import argparse
import json
import os
import sys

REPORTED = ("likely", "confirmed")


def mib(b):
    return f"{(b or 0) / 2**20:.2f} MiB"


def frame_str(fr):
    fn = fr.get("function") or "?"
    loc = os.path.basename(fr.get("file") or "")
    if loc:
        loc += f":{fr.get('line') or 0}"
    else:
        loc = os.path.basename(fr.get("module") or "") or "?"
    return f"{fn} ({loc})"


def describe(f, frames=6):
    rate = f.get("growth_bytes_per_step")
    rate = f"{mib(rate)}/step" if rate is not None else "rate ?"
    st = f.get("stack") or []
    top = " <- ".join(frame_str(fr) for fr in st[:frames])
    more = f" <- ... ({len(st) - frames} more)" if len(st) > frames else ""
    return (f"[{f.get('level')} leak] pid {f.get('pid')} dev {f.get('device')} "
            f"{mib(f.get('bytes'))} held, {rate}, api {f.get('api', '?')}: {top or '(no stack)'}{more}")


def epochs(doc):
    out = []
    for p in doc.get("processes", []):
        e = p.get("epochs") or {}
        if e:
            out.append(f"{e.get('source')}x{e.get('count')}")
    return ",".join(out) or "?"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("report")
    ap.add_argument("--expect", choices=("leak", "noleak"), required=True)
    ap.add_argument("--file")
    ap.add_argument("--line", type=int)
    ap.add_argument("--require-file", action="store_true")
    ap.add_argument("--strict-line", action="store_true")
    ap.add_argument("--require-vmm", action="store_true")
    ap.add_argument("--function")
    args = ap.parse_args()

    try:
        with open(args.report) as fh:
            doc = json.load(fh)
    except (OSError, ValueError) as e:
        print(f"report unreadable: {e}")
        return 1

    findings = doc.get("findings") or []
    leaks = [f for f in findings if f.get("kind") == "leak"]
    kinds = sorted({f.get("kind") for f in findings})
    devs = []
    reserved_va = 0
    for p in doc.get("processes", []):
        for d in p.get("devices", []):
            if d.get("device", 0) >= 0:
                reserved_va = max(reserved_va, d.get("reserved_va_bytes") or 0)
                devs.append(f"pid {p.get('pid')} dev {d.get('device')}: peak {mib(d.get('peak_bytes'))}, "
                            f"{d.get('events')} events, {d.get('lost_events')} lost, "
                            f"reserved VA {mib(d.get('reserved_va_bytes'))}")
    print(f"findings: {kinds or 'none'}; epochs: {epochs(doc)}", file=sys.stderr)
    for line in devs:
        print("  " + line, file=sys.stderr)
    for f in leaks:
        print("  " + describe(f, frames=12), file=sys.stderr)
    ctx = f"epochs {epochs(doc)}"
    if devs:
        ctx += "; " + devs[0]

    if args.expect == "noleak":
        bad = [f for f in leaks if f.get("level") in REPORTED]
        suspected = len(leaks) - len(bad)
        if bad:
            print(f"{len(bad)} false leak finding(s): {describe(bad[0])}; {ctx}")
            return 1
        print(f"no leak reported ({suspected} suspected, not reported); {ctx}")
        return 0

    if not leaks:
        print(f"no leak finding (findings: {kinds or 'none'}); {ctx}")
        return 1
    vmm_api = any(a in (f.get("api") or "") for f in leaks for a in ("cuMemCreate", "cuMemMap"))
    if args.require_vmm and reserved_va == 0 and not vmm_api:
        print(f"leak found, but no VA reservation was traced (VMM path not seen): "
              f"{describe(leaks[0])}; {ctx}")
        return 1

    if args.function:
        for f in leaks:
            if any(args.function in (fr.get("function") or "") for fr in f.get("stack") or []):
                print(f"leak names {args.function}: {describe(f)}")
                return 0
        print(f"leak found but no frame names {args.function}: {describe(leaks[0])}")
        return 1

    if args.file:
        named = []  # (finding, first frame in the file)
        for f in leaks:
            for fr in f.get("stack") or []:
                if os.path.basename(fr.get("file") or "") == args.file:
                    named.append((f, fr))
                    break
        if not named:
            if args.require_file:
                print(f"leak found but its stack names no {args.file} frame: {describe(leaks[0])}")
                return 1
            print(f"leak found (no {args.file} frame in its stack): {describe(leaks[0])}; {ctx}")
            return 0
        exact = [(f, fr) for f, fr in named if args.line is not None and fr.get("line") == args.line]
        f, fr = (exact or named)[0]
        where = f"{args.file}:{fr.get('line')}"
        if args.line is not None:
            where += " (the LEAK HERE line)" if exact else f" (LEAK HERE is line {args.line})"
        if args.strict_line and not exact:
            print(f"leak names {where}, not the leaking line: {describe(f)}")
            return 1
        print(f"leak at {where}: {describe(f)}; {ctx}")
        return 0

    print(f"leak found: {describe(leaks[0])}; {ctx}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
