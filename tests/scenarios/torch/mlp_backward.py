# An MLP trained a few steps, wide enough that its backward pass allocates as much as its
# forward: the gradients of its two Linear layers are made on PyTorch's autograd thread, with no
# Python frames, inside the nodes AddmmBackward0 of the lines FC1 and FC2, and the weights'
# gradients stay live to the end (zero_grad keeps them). Every report, the view, diff and the
# exports must name those allocations by these lines (`backward of addmm at ...`), never by a
# C++ frame; what the engine itself allocates, by the line that ran the backward pass.
import torch

from common import STEPS

WIDTH = 2048
BATCH = 512


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(WIDTH, WIDTH)
        self.fc2 = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        h = self.fc1(x).relu()  # FORWARD FC1
        return self.fc2(h)  # FORWARD FC2


model = MLP().cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(STEPS):
    optimizer.zero_grad(set_to_none=False)
    x = torch.randn(BATCH, WIDTH, device="cuda")
    loss = model(x).pow(2).mean()  # FORWARD CALL
    loss.backward()  # BACKWARD CALL
    optimizer.step()
print("done", STEPS, flush=True)
