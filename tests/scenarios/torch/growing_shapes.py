# Each step works on a longer sequence than the last: its activations grow 2.5 MiB per step and
# every tensor is freed by the step's end. Nothing leaks; PyTorch's caching allocator reserves a
# new segment each step (no cached block is large enough), so the reserve climbs far above the
# tensors: fragmentation, and a growing working set.
import torch

from common import STEPS

WIDTH = 1024
ROWS = 640  # rows per sequence position: 640 x 1024 floats = 2.5 MiB

model = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(STEPS):
    seq = 4 + step
    x = torch.randn(seq, ROWS, WIDTH, device="cuda")  # the input grows 2.5 MiB per step
    loss = model(x).pow(2).mean()  # FORWARD
    loss.backward()  # BACKWARD CALL
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    del x, loss
print("reserved", torch.cuda.max_memory_reserved(), "allocated", torch.cuda.max_memory_allocated(), flush=True)
print("done", STEPS, flush=True)
