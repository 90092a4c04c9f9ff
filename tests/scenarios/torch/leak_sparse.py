# A sparse leak: a 4 MiB tensor is kept every 8th step only (a checkpoint of activations that
# is never released); the steps in between free everything they make.
import torch

from common import STEPS, model_and_optimizer, train_step

model, optimizer = model_and_optimizer()
checkpoints = []
for step in range(STEPS):
    out, loss = train_step(model, optimizer)
    if step % 8 == 0:
        checkpoints.append(torch.empty(1 << 20, device="cuda"))  # LEAK: 4 MiB every 8th step
print("done", STEPS, flush=True)
