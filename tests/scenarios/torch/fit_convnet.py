# A conv net with batch norm: three stages of conv, batch norm and ReLU, pooled into a linear
# classifier, trained with SGD and momentum. The middle stage is checkpointed (CKPT=stage2).
import torch
from torch import nn

from fit_common import BATCH, CKPT, ckpt, train


def stage(cin, cout):
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1),
        nn.BatchNorm2d(cout),
        nn.ReLU(),
        nn.Conv2d(cout, cout, 3, padding=1),
        nn.BatchNorm2d(cout),
        nn.ReLU(),
    )


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stage1 = stage(3, 32)
        self.stage2 = stage(32, 64)
        self.stage3 = stage(64, 64)
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        x = self.stage1(x)
        x = ckpt("stage2", self.stage2, x) if "stage2" in CKPT else self.stage2(x)
        x = self.stage3(x)
        return self.fc(x.mean(dim=(2, 3)))


model = ConvNet().cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def step(i):
    x = torch.randn(BATCH, 3, 64, 64, device="cuda")
    y = torch.randint(0, 10, (BATCH,), device="cuda")
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


train(step)
