# Runs out of memory at a known line on a small simulated device (SIMCUDA_MEMORY=512MiB): each
# step needs a scratch buffer 8 MiB larger than the last, until one does not fit.
import torch

from common import model_and_optimizer, train_step

model, optimizer = model_and_optimizer()
for step in range(80):
    out, loss = train_step(model, optimizer)
    scratch = torch.empty(step + 1, 2 << 20, device="cuda")  # OOM HERE: 8 MiB more each step
    del scratch
print("done", step, flush=True)
