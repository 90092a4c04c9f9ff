# A clean loop: the same shapes every step; after the first step the cache serves every request.
from common import STEPS, model_and_optimizer, train_step
from whatif_common import report_peaks

WIDTH = 1024
model, optimizer = model_and_optimizer(WIDTH)
for step in range(STEPS):
    out, loss = train_step(model, optimizer, batch=2048)
    del out, loss
report_peaks(STEPS)
