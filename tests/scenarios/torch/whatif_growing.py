# Growing shapes: every step trains on a longer sequence than the last (each activation 2.5 MiB
# larger than the step before) and frees every tensor it made. Nothing accumulates, yet by
# default the caching allocator reserves a new segment every step: each request is larger than
# every cached free block.
from common import STEPS, model_and_optimizer, train_step
from whatif_common import report_peaks

WIDTH = 1024
TOKENS_PER_STEP = 640  # 640 tokens x 1024 floats x 4 B: 2.5 MiB more per activation each step

model, optimizer = model_and_optimizer(WIDTH)
for step in range(STEPS):
    out, loss = train_step(model, optimizer, batch=TOKENS_PER_STEP * (step + 1))
    del out, loss
report_peaks(STEPS)
