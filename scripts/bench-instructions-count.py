"""The instructions one run of scripts/bench-instructions.sh spent where asked, from its
callgrind files (`MODE.N.PID.cg-TT`: one per process and thread, thread 01 the main one).

Usage: bench-instructions-count.py WORK MODE N WHERE, WHERE one of
  program         the program's main (allocating) thread
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


total = 0
for path in glob.glob(os.path.join(work, f"{mode}.{n}.*.cg-*")):
    m = re.search(r"\.(\d+)\.cg-(\d+)$", path)
    if not m:
        continue
    thread = int(m.group(2))
    who = role(header(path, "cmd:"))
    wanted = {
        "program": who == "program" and thread == 1,
        "program-others": who == "program" and thread != 1,
        "collector": who == "collector",
        "run": who == "run",
    }[where]
    if wanted:
        total += int(header(path, "summary:") or 0)
print(total)
