# Run by torchrun with two workers: each trains the same model; rank 1 alone keeps a 4 MiB
# tensor every step (a rank-only buffer that is never cleared). No process group: what is
# tested is that each worker is labelled by the rank torchrun gave it.
import os

import torch

from common import STEPS, model_and_optimizer, train_step

rank = int(os.environ["RANK"])
model, optimizer = model_and_optimizer()
history = []
for step in range(STEPS):
    out, loss = train_step(model, optimizer)
    if rank == 1:
        history.append(torch.empty(1 << 20, device="cuda"))  # LEAK: rank 1 only
print("done", STEPS, flush=True)
