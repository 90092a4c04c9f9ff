# A leak made in the backward pass: every step keeps the gradient of its input batch in a
# list. That gradient is allocated on PyTorch's autograd thread, inside the node
# AddmmBackward0 of the first Linear layer, with no Python frames on that thread: the report
# must name the node and the forward line that created it (FORWARD HERE).
import torch

from common import BATCH, STEPS, WIDTH, model_and_optimizer

model, optimizer = model_and_optimizer()
grads = []
for step in range(STEPS):
    x = torch.randn(4 * BATCH, WIDTH, device="cuda", requires_grad=True)
    out = model(x)  # FORWARD HERE
    loss = out.float().pow(2).mean()
    loss.backward()
    grads.append(x.grad)  # LEAK: 256 KiB of input gradient kept every step
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
print("done", STEPS, flush=True)
