# Runs out of memory under a memory-fraction cap (run with SIMCUDA_MEMORY=1GiB): the program caps
# PyTorch's allocator at a quarter of the device, trains a few steps, then keeps 16 MiB buffers
# until the cap refuses one. The driver refuses nothing: three quarters of the device stay free,
# and PyTorch raises OutOfMemoryError itself.
import torch

from common import model_and_optimizer, train_step

torch.cuda.set_per_process_memory_fraction(0.25)
model, optimizer = model_and_optimizer()
for step in range(3):
    out, loss = train_step(model, optimizer)
    del out, loss
kept = []
try:
    for i in range(64):
        kept.append(torch.empty(4 << 20, device="cuda"))  # OOM HERE: 16 MiB each
except torch.cuda.OutOfMemoryError:
    print("OutOfMemoryError at buffer", len(kept), "reserved", torch.cuda.memory_reserved(),
          flush=True)
    raise
