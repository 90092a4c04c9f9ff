# A transformer: four blocks of self-attention (scores materialised, as a plain implementation
# does) and an MLP, trained with Adam. Each block is checkpointed (CKPT=block), as
# gradient checkpointing does.
import torch
from torch import nn

from fit_common import BATCH, CKPT, ckpt, train

SEQ, DIM, HEADS, VOCAB = 128, 256, 4, 1000


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(DIM)
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.proj = nn.Linear(DIM, DIM)
        self.ln2 = nn.LayerNorm(DIM)
        self.up = nn.Linear(DIM, 4 * DIM)
        self.down = nn.Linear(4 * DIM, DIM)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q = q.view(b, t, HEADS, d // HEADS).transpose(1, 2)
        k = k.view(b, t, HEADS, d // HEADS).transpose(1, 2)
        v = v.view(b, t, HEADS, d // HEADS).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (d // HEADS) ** -0.5
        att = att.softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.down(torch.relu(self.up(self.ln2(x))))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(4))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, idx):
        x = self.emb(idx)
        for block in self.blocks:
            x = ckpt("block", block, x) if "block" in CKPT else block(x)
        return self.head(x)


model = Model().cuda()
opt = torch.optim.Adam(model.parameters())


def step(i):
    idx = torch.randint(0, VOCAB, (BATCH, SEQ), device="cuda")
    logits = model(idx)
    loss = nn.functional.cross_entropy(logits.view(-1, VOCAB), idx.view(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


train(step)
