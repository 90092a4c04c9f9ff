# A data-parallel job started the way PyTorch's DDP tutorial does: torch.multiprocessing.spawn
# passes each worker its rank as an argument (no RANK in the environment), and the worker gives
# it to init_process_group (gloo, through a file in the working directory). Rank 1 alone keeps
# a 4 MiB tensor every step.
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from common import STEPS, model_and_optimizer, train_step

WORLD = 2


def worker(rank, store):
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank,
                            world_size=WORLD)
    model, optimizer = model_and_optimizer()
    history = []
    for step in range(STEPS):
        out, loss = train_step(model, optimizer)
        if rank == 1:
            history.append(torch.empty(1 << 20, device="cuda"))  # LEAK: rank 1 only
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(os.path.abspath("rendezvous"),), nprocs=WORLD)
    print("done", STEPS, flush=True)
