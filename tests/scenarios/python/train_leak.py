# A training loop on the stand-in torch: activations come and go every step, and
# `history.append(...)` keeps 1 MiB per step alive (the planted leak): the report must name
# the line that allocated it (ALLOC HERE) and the loop line that called it.
# Usage: train_leak.py [steps] [--clean] [--install] [--mark] [--mark-in-hook] [--stats]
# --install: oomtrace.install() first; --mark: oomtrace.mark_step() after every optimizer step
# (the program marks its own steps); --mark-in-hook: the same from an optimizer step hook of
# the program's own; --stats: print PyTorch's memory statistics after the last step.
import sys

if {"--install", "--mark", "--mark-in-hook"} & set(sys.argv):
    import oomtrace
if "--install" in sys.argv:
    oomtrace.install(allocator="swap")

import torch

MIB = 1 << 20
steps = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 30
clean = "--clean" in sys.argv
opt = torch.optim.Optimizer()
if "--mark-in-hook" in sys.argv:
    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(lambda optimizer, args, kwargs: oomtrace.mark_step())
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
    if "--mark" in sys.argv:
        oomtrace.mark_step()
if "--stats" in sys.argv:
    print("stats", torch.cuda.memory_allocated(0), torch.cuda.max_memory_allocated(0),
          torch.cuda.memory_reserved(0))
print("trained", steps)
