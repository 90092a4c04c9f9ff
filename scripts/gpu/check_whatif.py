"""Judge of gpu-check's check e: fragmentation found, and `oomtrace whatif` within 10 % of what
PyTorch reserved on the GPU under each setting.

Usage: check_whatif.py DIR   (DIR holds report.json, whatif-default.json, whatif-expandable.json,
and untraced-default.stdout.txt / untraced-expandable.stdout.txt, whose last "reserved N
allocated M" line is the script's own torch.cuda.max_memory_reserved()). Prints one line; exit 1
when a check fails.
"""
import json
import sys


def measured(path):
    for line in reversed(open(path).read().splitlines()):
        if line.startswith("reserved "):
            return int(line.split()[1])
    raise SystemExit("no 'reserved N' line in %s" % path)


def predicted(path):
    doc = json.load(open(path))
    return max(d["peak_reserved_bytes"] for p in doc["processes"] for d in p["devices"])


def main(d):
    report = json.load(open(d + "/report.json"))
    frag = [f for f in report["findings"] if f["kind"] == "fragmentation"]
    leaks = [f for f in report["findings"] if f["kind"] == "leak"]
    out, ok = [], True
    out.append("fragmentation found" if frag else "NO fragmentation finding")
    ok &= bool(frag)
    out.append("no leak" if not leaks else "%d false leak(s)" % len(leaks))
    ok &= not leaks
    for name in ("default", "expandable"):
        m = measured("%s/untraced-%s.stdout.txt" % (d, name))
        p = predicted("%s/whatif-%s.json" % (d, name))
        off = (p - m) / m
        ok &= abs(off) <= 0.10
        out.append("%s: measured %d predicted %d (%+.1f %%)" % (name, m, p, 100 * off))
    print("; ".join(out))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
