# A leak in a loop that logs PyTorch's own memory statistics every step: under
# `oomtrace run --torch` the statistics keep working (PyTorch's caching allocator stays).
import torch

from common import STEPS, model_and_optimizer, train_step

model, optimizer = model_and_optimizer()
history = []
for step in range(STEPS):
    out, loss = train_step(model, optimizer)
    history.append(torch.empty(1 << 20, device="cuda"))  # LEAK: 4 MiB kept every step
    print("step", step, "allocated", torch.cuda.memory_allocated(),
          "reserved", torch.cuda.memory_reserved(),
          "max_allocated", torch.cuda.max_memory_allocated(), flush=True)
summary = torch.cuda.memory_summary()
print("summary lines", len(summary.splitlines()), flush=True)
print("done", STEPS, flush=True)
