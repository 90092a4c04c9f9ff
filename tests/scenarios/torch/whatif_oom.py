# Out of memory with the memory there, in pieces (run with SIMCUDA_MEMORY=1GiB): after a few
# training steps the program keeps 120 buffers of 7 MiB. By default the caching allocator
# serves each pair of them from one 20 MiB segment, so every segment keeps 6 MiB free that no
# later 7 MiB request fits: the device fills at about 100 buffers, with 300 MiB reserved but
# unallocated. With expandable_segments the buffers are packed into one segment and all fit.
import torch

from common import model_and_optimizer, train_step
from whatif_common import report_peaks

MIB_OF_FLOATS = 1 << 18  # float32 elements: 1 MiB
STEPS = 3

model, optimizer = model_and_optimizer()
for step in range(STEPS):
    out, loss = train_step(model, optimizer)
    del out, loss
kept = []
oom = False
try:
    for i in range(120):
        kept.append(torch.empty(7 * MIB_OF_FLOATS, device="cuda"))  # OOM HERE: 7 MiB each
except torch.cuda.OutOfMemoryError as e:
    oom = True
    print("OutOfMemoryError at buffer", len(kept), ":", str(e).splitlines()[0], flush=True)
report_peaks(STEPS, oom)
