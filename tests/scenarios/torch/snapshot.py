# Writes a PyTorch memory snapshot the way PyTorch documents it (`_record_memory_history`, then
# `_dump_snapshot`, or from an out-of-memory observer), for `oomtrace report SNAPSHOT.pickle`.
# KIND: leak (a list keeps a tensor a step), fragment (a buffer rebuilt larger each step beside a
# kept small one), oom (a buffer 8 MiB larger each step until the device is full: the snapshot is
# written by the OOM observer). MAX_ENTRIES: the history's ring buffer (default PyTorch's).
# STACKS: what `_record_memory_history` records ("all" by default, or "python").
# Writes to SNAPSHOT; prints "done <kind>".
import os
import sys

import torch

from common import model_and_optimizer, train_step

KIND = os.environ.get("KIND", "leak")
SNAPSHOT = os.environ.get("SNAPSHOT", "snapshot.pickle")
STEPS = int(os.environ.get("STEPS", "40"))

history = {"stacks": os.environ.get("STACKS", "all")}
if "MAX_ENTRIES" in os.environ:
    history["max_entries"] = int(os.environ["MAX_ENTRIES"])
torch.cuda.memory._record_memory_history(**history)


def dump_on_oom(device, alloc, device_allocated, device_free):
    torch.cuda.memory._dump_snapshot(SNAPSHOT)


torch._C._cuda_attach_out_of_memory_observer(dump_on_oom)

model, optimizer = model_and_optimizer()
kept = []
try:
    for step in range(STEPS):
        out, loss = train_step(model, optimizer)
        if KIND == "leak":
            kept.append(torch.empty(1 << 18, device="cuda"))  # LEAK HERE
        elif KIND == "fragment":
            big = torch.empty((step + 1) * (3 << 18), device="cuda")  # GROWS HERE
            kept.append(torch.empty(1 << 10, device="cuda"))
            del big
        elif KIND == "oom":
            scratch = torch.empty(step + 1, 2 << 20, device="cuda")  # OOM HERE
            del scratch
except torch.cuda.OutOfMemoryError:
    print("done", KIND, flush=True)
    sys.exit(0)
if KIND != "oom":
    torch.cuda.memory._dump_snapshot(SNAPSHOT)
print("done", KIND, flush=True)
