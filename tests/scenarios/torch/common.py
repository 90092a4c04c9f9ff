"""Shared by the real-PyTorch scenarios: a small model, its optimizer and one training step.

Kernels are no-ops on the simulated driver, so the numbers computed are garbage; allocation
patterns, streams, copies and the caching allocator are PyTorch's own. Every scenario takes its
step count from STEPS (default 40) and prints one line, "done <steps>", when it finishes.

With OWN_ALLOCATOR=1 the scenario does what a user of PyTorch's pluggable-allocator API does in
their own script: route every tensor through oomtrace's entry points (the library named by
OOMTRACE_LIB) before anything touches CUDA.
"""
import os

import torch

if os.environ.get("OWN_ALLOCATOR") == "1":
    torch.cuda.memory.change_current_allocator(
        torch.cuda.memory.CUDAPluggableAllocator(
            os.environ["OOMTRACE_LIB"], "oomtrace_malloc", "oomtrace_free"
        )
    )

STEPS = int(os.environ.get("STEPS", "40"))
WIDTH = 256
BATCH = 64


def model_and_optimizer(width=WIDTH):
    model = torch.nn.Sequential(
        torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width)
    ).cuda()
    return model, torch.optim.Adam(model.parameters())


def train_step(model, optimizer, batch=BATCH):
    width = model[0].in_features
    x = torch.randn(batch, width, device="cuda")
    out = model(x)
    loss = out.float().pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return out, loss
