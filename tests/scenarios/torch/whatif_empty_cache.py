# Variable-length requests with torch.cuda.empty_cache() between them (run with
# SIMCUDA_MEMORY=4GiB): a 300 MiB batch, freed and given back to the driver, then two of 200 MiB.
# PyTorch reserves 400 MiB at most; a replay that keeps the 300 MiB segment cached (the trace
# shows the segment given back, not why) places one 200 MiB request in it and takes another
# segment: 500 MiB. `oomtrace whatif` must say that its replay of the run's own setting is off.
import torch

from whatif_common import report_peaks

MIB_OF_FLOATS = 1 << 18

long_batch = torch.empty(300 * MIB_OF_FLOATS, device="cuda")
del long_batch
torch.cuda.empty_cache()
short = [torch.empty(200 * MIB_OF_FLOATS, device="cuda") for _ in range(2)]  # PEAK HERE
del short
report_peaks(0, False)
