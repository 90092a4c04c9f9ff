# What the memory is, on a model trained with Adam: an MLP whose parameters, gradients and
# Adam's two moments the script sizes itself, a batch each step, and activations the backward
# pass frees. Prints "params <bytes>" (the parameters' bytes) and "peak <max_memory_reserved>".
# With KEEP=1 the program keeps each step's output with its graph (a list), as a leak does.
import os

import torch

from common import STEPS

WIDTH = int(os.environ.get("WIDTH", "512"))
BATCH = int(os.environ.get("BATCH", "256"))
KEEP = os.environ.get("KEEP") == "1"

model = torch.nn.Sequential(
    torch.nn.Linear(WIDTH, 4 * WIDTH),
    torch.nn.ReLU(),
    torch.nn.Linear(4 * WIDTH, 4 * WIDTH),
    torch.nn.ReLU(),
    torch.nn.Linear(4 * WIDTH, WIDTH),
).cuda()
optimizer = torch.optim.Adam(model.parameters())
params = sum(p.numel() * p.element_size() for p in model.parameters())
print("params", params, flush=True)
kept = []
for step in range(STEPS):
    x = torch.randn(BATCH, WIDTH, device="cuda")
    out = model(x)
    loss = out.pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if KEEP:
        kept.append(out)
print("peak", torch.cuda.max_memory_reserved(), flush=True)
print("done", STEPS, flush=True)
