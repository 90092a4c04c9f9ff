# Varying batch sizes: each step's batch is drawn at random (seeded, so every run asks for the
# same sizes in the same order) between 64 and 4096 rows; every tensor is freed each step.
import random

from common import STEPS, model_and_optimizer, train_step
from whatif_common import report_peaks

WIDTH = 1024
rng = random.Random(23)
model, optimizer = model_and_optimizer(WIDTH)
for step in range(STEPS):
    out, loss = train_step(model, optimizer, batch=rng.randint(64, 4096))
    del out, loss
report_peaks(STEPS)
