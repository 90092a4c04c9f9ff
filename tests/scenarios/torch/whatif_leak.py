# A leak: a list keeps every step's output (1024 x 1024 floats, 4 MiB) alive.
from common import STEPS, model_and_optimizer, train_step
from whatif_common import report_peaks

WIDTH = 1024
model, optimizer = model_and_optimizer(WIDTH)
outputs = []
for step in range(STEPS):
    out, loss = train_step(model, optimizer, batch=1024)
    outputs.append(out.detach())  # LEAK: 4 MiB kept every step
report_peaks(STEPS)
