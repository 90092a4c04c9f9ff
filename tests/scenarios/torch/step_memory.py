# PyTorch's own statistics at every optimizer step, read by the script itself from a step hook
# of its own (registered after oomtrace's, so it runs right after oomtrace's reading, with
# nothing allocated between them), over a loop whose batch grows every step (the cache grows);
# the last reading is printed: "stats <allocated> <max allocated> <reserved>".
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from common import STEPS, model_and_optimizer, train_step

last = None


def read(optimizer, args, kwargs):
    global last
    last = (torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated(),
            torch.cuda.memory_reserved())


register_optimizer_step_post_hook(read)
model, optimizer = model_and_optimizer()
for step in range(STEPS):
    train_step(model, optimizer, batch=64 + 32 * step)
print("stats", *last, flush=True)
print("done", STEPS, flush=True)
