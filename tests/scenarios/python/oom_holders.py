# Under `oomtrace run --torch` on a 256 MiB simulated GPU: two 64 MiB tensors (HOLDER) and a
# raw 2 MiB block that is never freed (NEVER FREED) are held when a tensor of 1 TiB is asked
# for (TOO BIG) and fails. The OOM, both holders, the failed allocation and the block live at
# exit each have a Python stack; the text report must show all of it.
# Prints "oom caught".
import torch

MIB = 1 << 20


def make_activations():
    return [torch.empty(64 * MIB) for _ in range(2)]  # HOLDER


def keep_forever():
    return torch.cuda._allocate(2 * MIB, 0)  # NEVER FREED


def too_big():
    return torch.empty(1 << 40)  # TOO BIG


kept = make_activations()
raw = keep_forever()
try:
    too_big()
except RuntimeError:
    print("oom caught")
