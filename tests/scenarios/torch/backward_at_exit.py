# A training loop without an optimizer that ends right after its last backward pass: the
# autograd thread is still dropping that pass's graph task when the interpreter exits, the
# race of pytorch#38228 ("terminate called without an active exception", exit 134) that a
# traced run made likely (it exited 134 in 5 of 6 runs before oomtrace let the thread finish).
import torch
from torch import nn

model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 512)).cuda()
history = []
for i in range(120):
    x = torch.randn(64, 512, device="cuda")
    loss = model(x).pow(2).mean()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.01 * p.grad
            p.grad = None
    history.append(loss)
print("done", flush=True)
