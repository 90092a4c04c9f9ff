# A clean training loop: memory reaches a steady state after the first steps.
from common import STEPS, model_and_optimizer, train_step

model, optimizer = model_and_optimizer()
total_loss = 0.0
for step in range(STEPS):
    out, loss = train_step(model, optimizer)
    total_loss += loss.item()
print("done", STEPS, flush=True)
