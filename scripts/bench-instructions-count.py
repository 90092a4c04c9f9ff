"""The instructions one run of scripts/bench-instructions.sh spent where asked, from its
callgrind files (`MODE.N.PID.cg-TT`: one per process and thread, thread 01 the main one; a
thread whose counts were dumped on the way also has `MODE.N.PID.cg.K-TT`, its K-th part).

Usage: bench-instructions-count.py WORK MODE N WHERE, WHERE one of
  program         the program's main (allocating) thread: in a run that dumped it (PyTorch's,
                  at each `time.thread_time_ns()`), its second part, the timed loop; else
                  the whole thread
  program-others  the program's other threads (the shim's drain thread among them)
  collector       every thread of `oomtrace collect`
  run             every thread of `oomtrace run` (its replay of the trace for the summary)
Prints one integer (0 when the run had no such process).
"""
import glob
import os
import re
import sys

work, mode, n, where = sys.argv[1:5]


def header(path, key):
    with open(path, errors="replace") as f:
        for line in f:
            if line.startswith(key):
                return line[len(key):].strip()
    return ""


def role(cmd):
    words = cmd.split()
    if len(words) >= 2 and os.path.basename(words[0]) == "oomtrace":
        return {"collect": "collector", "run": "run"}.get(words[1], "other")
    return "program"


# (process, part or None for the last, thread) -> instructions, and each process's role.
counts = {}
roles = {}
for path in glob.glob(os.path.join(work, f"{mode}.{n}.*.cg*-*")):
    m = re.search(r"\.(\d+)\.cg(?:\.(\d+))?-(\d+)$", path)
    if not m:
        continue
    pid, part, thread = m.group(1), m.group(2), int(m.group(3))
    roles.setdefault(pid, role(header(path, "cmd:")))
    counts[(pid, int(part) if part else None, thread)] = int(header(path, "summary:") or 0)

total = 0
for (pid, part, thread), value in counts.items():
    who = roles[pid]
    if where == "program" and who == "program" and thread == 1:
        dumped = any(p == 2 and t == 1 for (q, p, t) in counts if q == pid)
        total += value if part == (2 if dumped else None) else 0
    elif {
        "program-others": who == "program" and thread != 1,
        "collector": who == "collector",
        "run": who == "run",
    }.get(where, False):
        total += value
print(total)
