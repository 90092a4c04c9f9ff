# A small leak under heavy churn: every step makes about 200 MiB of temporaries (freed in the
# step, so the caching allocator reuses its segments) and keeps one 64 KiB tensor. At the
# segment level the cache absorbs the leak; traced tensors show it at its line.
import torch

from common import STEPS, model_and_optimizer, train_step

model, optimizer = model_and_optimizer()
kept = []
for step in range(STEPS):
    out, loss = train_step(model, optimizer)
    scratch = [torch.empty(25 << 20, dtype=torch.uint8, device="cuda") for _ in range(8)]
    del scratch
    kept.append(torch.empty(16 << 10, device="cuda"))  # LEAK: 64 KiB kept every step
print("done", STEPS, flush=True)
