# A clean loop with a periodic evaluation under no_grad: memory rises during eval and comes back.
import torch

from common import STEPS, WIDTH, model_and_optimizer, train_step

model, optimizer = model_and_optimizer()
for step in range(STEPS):
    out, loss = train_step(model, optimizer)
    if step % 10 == 9:
        model.eval()
        with torch.no_grad():
            for _ in range(3):
                model(torch.randn(512, WIDTH, device="cuda")).sum().item()
        model.train()
print("done", STEPS, flush=True)
