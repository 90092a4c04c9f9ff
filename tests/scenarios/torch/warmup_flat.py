# Warm-up, then flat (run with STEPS=80): for its first 16 steps the program's batches grow (a
# curriculum, a bucketing loader filling up), each a scratch tensor 8 MiB larger than the
# last, which the caching allocator serves from a new segment while it keeps the smaller ones;
# from then on every step is the same size and fits the cache. The gap between PyTorch's reserve
# and its tensors grows while the batches grow, then holds for the rest of the run.
import torch

from common import STEPS, model_and_optimizer, train_step

MIB_OF_FLOATS = 1 << 18

model, optimizer = model_and_optimizer()
for step in range(STEPS):
    grown = min(step + 1, 16)
    scratch = torch.empty(grown * 8 * MIB_OF_FLOATS, device="cuda")  # GROWS, THEN HOLDS
    out, loss = train_step(model, optimizer)
    del scratch, out, loss
print("done", STEPS, flush=True)
