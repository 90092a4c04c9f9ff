# Run by `oomtrace run --simulate 1GiB` from the venv's python with no driver anywhere on the
# library path (tests/it/torch/simulate.rs): a leak of 4 MiB every step, then a request no
# 1 GiB GPU holds, uncaught, so the program exits with Python's 1.
import torch

from common import STEPS, model_and_optimizer, train_step

model, optimizer = model_and_optimizer()
history = []
for step in range(STEPS):
    out, loss = train_step(model, optimizer)
    history.append(torch.empty(1 << 20, device="cuda"))  # LEAK: 4 MiB kept every step
print("done", STEPS, flush=True)
evaluation = torch.empty(1 << 30, device="cuda")  # OOM HERE: 4 GiB on a 1 GiB GPU
