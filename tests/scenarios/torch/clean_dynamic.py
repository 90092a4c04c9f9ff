# A clean loop with dynamic shapes: the batch size cycles, so the cache holds blocks of
# several sizes, but nothing grows step after step.
from common import BATCH, STEPS, model_and_optimizer, train_step

model, optimizer = model_and_optimizer()
for step in range(STEPS):
    out, loss = train_step(model, optimizer, batch=BATCH * (1 + step % 4))
print("done", STEPS, flush=True)
