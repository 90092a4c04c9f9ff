# A training loop on the stand-in torch: activations come and go every step, and
# `history.append(...)` keeps 1 MiB per step alive (the planted leak): the report must name
# the line that allocated it (ALLOC HERE) and the loop line that called it.
# Usage: train_leak.py [steps] [--clean] [--install]
import sys

if "--install" in sys.argv:
    import oomtrace
    oomtrace.install()

import torch

MIB = 1 << 20
steps = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 30
clean = "--clean" in sys.argv
opt = torch.optim.Optimizer()
weights = torch.empty(8 * MIB)
history = []


def forward(step):
    activations = [torch.empty(4 * MIB) for _ in range(3)]
    output = torch.empty(MIB)  # ALLOC HERE
    del activations
    return output


for step in range(steps):
    output = forward(step)
    if not clean:
        history.append(output)  # LEAK HERE
    opt.step()
print("trained", steps)
