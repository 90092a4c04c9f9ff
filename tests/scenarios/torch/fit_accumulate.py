# AdamW with gradient accumulation: each optimizer step sums the gradients of four micro-batches
# of BATCH rows through a residual MLP. Its feed-forward module is checkpointed (CKPT=ff).
import torch
from torch import nn

from fit_common import BATCH, CKPT, ckpt, train

WIDTH, ACCUMULATE = 1024, 4


class FeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(WIDTH, 4 * WIDTH)
        self.down = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):
        return self.down(nn.functional.gelu(self.up(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(WIDTH, WIDTH)
        self.ff = FeedForward()
        self.out = nn.Linear(WIDTH, 10)

    def forward(self, x):
        h = torch.relu(self.inp(x))
        h = h + (ckpt("ff", self.ff, h) if "ff" in CKPT else self.ff(h))
        return self.out(h)


model = Net().cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)


def step(i):
    for _ in range(ACCUMULATE):
        x = torch.randn(BATCH, WIDTH, device="cuda")
        y = torch.randint(0, 10, (BATCH,), device="cuda")
        loss = nn.functional.cross_entropy(model(x), y) / ACCUMULATE
        loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


train(step)
