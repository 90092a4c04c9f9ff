# Not a leak: a producer thread puts CUDA batches into a queue.Queue ahead of the training loop
# that consumes them (a prefetcher), one batch a step more than the loop takes for the first
# part of the run, so a backlog piles up step after step; then it stops producing and the loop
# catches up, the queue empties and every batch it held is freed while the loop still runs
# (its last steps train on a batch of its own). The backlog drained: growth, not a leak.
import queue
import threading

import torch

from common import STEPS, model_and_optimizer, train_step

WIDTH = 256
BATCH = 1024  # 1 MiB a batch
AHEAD = STEPS * 2 // 5  # steps with two batches produced for each one consumed
BATCHES = 2 * AHEAD  # produced in all; the loop consumes them in 2 * AHEAD steps

model, optimizer = model_and_optimizer(width=WIDTH)
batches = queue.Queue()
tokens = threading.Semaphore(0)


def producer():
    for _ in range(BATCHES):
        tokens.acquire()
        batches.put(torch.randn(BATCH, WIDTH, device="cuda"))  # BACKLOG


thread = threading.Thread(target=producer, daemon=True)
thread.start()
own = torch.randn(BATCH, WIDTH, device="cuda")
for step in range(STEPS):
    if step < AHEAD:
        tokens.release(2)  # the producer runs ahead
    if step < BATCHES:
        x = batches.get()
    else:
        x = own  # the queue is empty: the backlog is gone
    out = model(x)
    loss = out.pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
thread.join()
assert batches.empty()
print("done", STEPS, flush=True)
