# oomtrace.install() called after PyTorch already initialised CUDA (the swap cannot be had
# then): the tracker attaches at once, and the leak below is named at its line.
import torch

from common import STEPS, model_and_optimizer, train_step

model, optimizer = model_and_optimizer()
assert torch.cuda.is_initialized()
import oomtrace  # noqa: E402 (after CUDA is up, on purpose)

assert oomtrace.install() is True
history = []
for step in range(STEPS):
    out, loss = train_step(model, optimizer)
    history.append(torch.empty(1 << 20, device="cuda"))  # LEAK: 4 MiB kept every step
print("done", STEPS, flush=True)
