# A leak of one logical buffer: a KV cache grown by concatenation. Every step torch.cat
# allocates the whole cache again, 1 MiB larger, and the previous tensor is freed when the
# name is rebound: no tensor survives the next step, yet the cache grows 1 MiB per step.
# KV_WINDOW=1: the clean variant, a fixed-size cache (cat, then slice back to 8 MiB).
import os

import torch

from common import STEPS, model_and_optimizer, train_step

ROW = 1 << 18  # float32 elements: 1 MiB
WINDOW = os.environ.get("KV_WINDOW") == "1"
model, optimizer = model_and_optimizer()
cache = torch.zeros(8 * ROW, device="cuda")
for step in range(STEPS):
    out, loss = train_step(model, optimizer)
    new = torch.randn(ROW, device="cuda")
    cache = torch.cat([cache, new])  # LEAK: +1 MiB per step (unless KV_WINDOW)
    if WINDOW:
        cache = cache[-8 * ROW :].clone()
print("done", STEPS, flush=True)
