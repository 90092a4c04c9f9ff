# What oomtrace's wrappers of PyTorch's allocator methods must leave as they were: PyTorch's
# own deleter check (CUDA graph trees rely on it), raw allocations (cuDNN/Thrust workspaces,
# caching_allocator_alloc), tensors made and freed on a side stream, and PyTorch's count of
# allocated bytes; every tensor is freed by the end.
import torch

x = torch.empty(1000, device="cuda")
check = getattr(torch._C, "_has_Standard_Deleter", None)
print("std_deleter", check(x.untyped_storage()._cdata) if check else "n/a", flush=True)
p = torch.cuda.caching_allocator_alloc(4096)
print("raw", p != 0, torch.cuda.memory_allocated(), flush=True)
torch.cuda.caching_allocator_delete(p)
s = torch.cuda.Stream()
with torch.cuda.stream(s):
    y = torch.empty(1 << 20, device="cuda")
    del y
    # From the side stream's segment, made above: no new segment this time.
    y = torch.empty(1 << 20, device="cuda")
print("side_stream", hex(s.stream_id), flush=True)
del y, x
print("allocated", torch.cuda.memory_allocated(), flush=True)
