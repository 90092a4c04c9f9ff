# A leak: every step keeps a 4 MiB activation alive in a list.
import torch

from common import STEPS, model_and_optimizer, train_step

model, optimizer = model_and_optimizer()
history = []
for step in range(STEPS):
    out, loss = train_step(model, optimizer)
    history.append(torch.empty(1 << 20, device="cuda"))  # LEAK: 4 MiB kept every step
print("done", STEPS, flush=True)
