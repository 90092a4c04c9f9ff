# A leak: `total_loss += loss` on a loss computed with autograd on and never backpropagated (a
# monitoring loss outside `torch.no_grad()`) keeps every step's graph, and the activations it
# saved, reachable. Wide layers (a 256 x 1024 batch: 1 MiB per activation), so that each graph
# holds a few MiB, as in a real model.
from common import STEPS, model_and_optimizer, train_step

model, optimizer = model_and_optimizer(width=1024)
total_loss = 0
for step in range(STEPS):
    out, loss = train_step(model, optimizer, batch=256)
    monitored = model(out.detach()).pow(2).mean()
    total_loss += monitored  # LEAK: the graph of every step stays reachable
print("done", STEPS, flush=True)
