# A leak: every step's output is kept with its autograd graph (`history.append(model(x))`, an
# output that requires grad): the list holds the output, and through its graph the
# activations the forward saved for backward and its input. One bug: one leak finding, at the
# appending line, with the retained parts listed. Wide layers (a 256 x 1024 batch: 1 MiB per
# tensor), as in leak_activations.py.
import torch

from common import STEPS, model_and_optimizer, train_step

model, optimizer = model_and_optimizer(width=1024)
history = []
for step in range(STEPS):
    out, loss = train_step(model, optimizer, batch=256)
    x = torch.randn(256, 1024, device="cuda")  # INPUT
    history.append(model(x))  # LEAK: the output and its graph kept every step
print("done", STEPS, flush=True)
