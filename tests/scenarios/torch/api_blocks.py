# Two blocks traced in one process with the Python API (`with oomtrace.trace()`, then
# `oomtrace.start()`/`stop()`), no `oomtrace run`: a clean loop, then a loop that keeps a tensor
# each step. Prints one JSON line: each block's findings (kind, where), its own tensor peak, and
# the trace the library wrote (in a directory of its own, which must be gone at exit).
import json

import torch

import oomtrace

model = torch.nn.Linear(256, 256).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
kept = []


def train(steps, keep):
    for _ in range(steps):
        loss = model(torch.randn(64, 256, device="cuda")).sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if keep:
            kept.append(torch.empty(1 << 18, device="cuda"))  # LEAK HERE


# One step first: cuBLAS's workspaces (made on the first matmul, through PyTorch's allocator
# with CUDA 12) belong to no block.
train(1, keep=False)
with oomtrace.trace() as clean:
    train(30, keep=False)
oomtrace.start()
train(30, keep=True)
leaky = oomtrace.stop()

text = leaky.report()
print(json.dumps({
    "clean": [[f.kind, f.where] for f in clean.findings],
    "leaky": [[f.kind, f.where] for f in leaky.findings],
    "leaky_own_peak": leaky.own_tensor_peak_bytes,
    "clean_own_peak": clean.own_tensor_peak_bytes,
    "text_has_leak": "[confirmed leak]" in text,
    "html": len(leaky._repr_html_()),
    "trace": leaky.path,
}), flush=True)
