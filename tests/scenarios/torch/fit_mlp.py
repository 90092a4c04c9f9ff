# An MLP: an encoder of four wide layers and a head, trained with Adam. The encoder is the
# module checkpointed (CKPT=encoder).
import torch
from torch import nn

from fit_common import BATCH, CKPT, ckpt, train

WIDTH = 1024


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(WIDTH, WIDTH)
        self.l2 = nn.Linear(WIDTH, WIDTH)
        self.l3 = nn.Linear(WIDTH, WIDTH)
        self.l4 = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        x = torch.relu(self.l1(x))
        x = torch.relu(self.l2(x))
        x = torch.relu(self.l3(x))
        return torch.relu(self.l4(x))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = Encoder()
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, x):
        h = ckpt("encoder", self.encoder, x) if "encoder" in CKPT else self.encoder(x)
        return self.head(h)


model = Net().cuda()
opt = torch.optim.Adam(model.parameters())


def step(i):
    x = torch.randn(BATCH, WIDTH, device="cuda")
    y = torch.randint(0, 10, (BATCH,), device="cuda")
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


train(step)
