# A small leak, the textbook one: `losses.append(loss)` after `loss.backward()`. The graph is
# freed by the backward pass; what the list keeps is each step's scalar loss, one tensor a
# step (512 B as PyTorch's allocator rounds it). Small, steady, never freed: found however
# small, with words that say it is small.
import torch

from common import STEPS, model_and_optimizer

model, optimizer = model_and_optimizer()
losses = []
for step in range(STEPS):
    x = torch.randn(64, 256, device="cuda")
    loss = model(x).pow(2).mean()  # LEAK: the scalar made here is kept
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    losses.append(loss)
print("done", STEPS, flush=True)
