# A training loop on the stand-in torch with its caching allocator (FAKE_TORCH_CACHING=1), as
# PyTorch runs without --torch: the events are the cache's segments, not tensors. Each step
# keeps its 4 MiB output in a list (the planted leak, KEEP HERE), so the cache reserves one
# more segment per step, at whichever request finds it exhausted: the output's line on even
# steps (OUTPUT HERE), the activations' line on odd ones (ACTIVATIONS HERE). The device grows
# by 4 MiB a step; neither line allocates every step.
# Usage: cache_growth.py [steps] [--clean]
import sys

import torch

MIB = 1 << 20
steps = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 40
clean = "--clean" in sys.argv
opt = torch.optim.Optimizer()
weights = torch.empty(64 * MIB)
history = []


def activations():
    return [torch.empty(4 * MIB) for _ in range(3)]  # ACTIVATIONS HERE


def output():
    return torch.empty(4 * MIB)  # OUTPUT HERE


def forward(step):
    # The order differs by step (as ops do under control flow), and with it the request that
    # finds the cache exhausted.
    if step % 2 == 0:
        acts = activations()
        out = output()
    else:
        out = output()
        acts = activations()
    del acts
    return out


for step in range(steps):
    out = forward(step)
    if not clean:
        history.append(out)  # KEEP HERE
    del out
    opt.step()
print("trained", steps)
