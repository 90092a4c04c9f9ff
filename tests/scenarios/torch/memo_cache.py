# A memo cache of CUDA tensors keyed by sequence length (functools.lru_cache around a function
# that builds a table per length), beside a small training loop. CACHE picks the variant:
# - "widening" (default): unbounded, lengths from a range that widens slowly: new tables arrive
#   at irregular, thinning intervals and none is ever freed (a leak that slows down);
# - "fixed": unbounded, lengths from a fixed range of 12: the cache fills, then holds (bounded);
# - "bounded": lru_cache(maxsize=8) over the widening range: old tables are evicted (clean).
import functools
import os
import random

import torch

from common import STEPS, model_and_optimizer, train_step

CACHE = os.environ.get("CACHE", "widening")
random.seed(7)


def table(length):
    return torch.randn(length, 1024, device="cuda")  # CACHE HERE: one table per length


table = functools.lru_cache(maxsize=8 if CACHE == "bounded" else None)(table)

model, optimizer = model_and_optimizer()
for step in range(STEPS):
    if CACHE == "fixed":
        length = 1024 + 16 * random.randrange(12)
    else:
        length = 1024 + 16 * random.randrange(4 + step // 2)  # the range widens slowly
    t = table(length)
    out, loss = train_step(model, optimizer)
    del out, loss, t
print("done", STEPS, "tables", table.cache_info().currsize, flush=True)
