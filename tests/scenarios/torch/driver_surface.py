# What simcuda must do for real PyTorch, one check per line ("ok <what>"): the device, tensors
# and exact copies, events and streams, a training step through cuBLAS/cuBLASLt and Adam,
# the same under bf16 and fp16 autocast (cuBLASLt's half-precision path), PyTorch's own
# memory history and snapshot, and cudaMemGetInfo. Kernels are no-ops, so only
# values that never pass through a kernel are compared.
import torch

assert torch.cuda.is_available()
props = torch.cuda.get_device_properties(0)
assert (props.major, props.minor) == (9, 0) and props.multi_processor_count == 132, props
print("ok device", props.name, flush=True)

host = torch.arange(1 << 16, dtype=torch.float32)
assert torch.equal(host.cuda().cpu(), host)
pinned = host.pin_memory()
assert torch.equal(pinned.cuda(non_blocking=True).cpu(), host)
print("ok copies", flush=True)

side = torch.cuda.Stream()
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
with torch.cuda.stream(side):
    on_side = host.cuda()
torch.cuda.current_stream().wait_stream(side)
end.record()
torch.cuda.synchronize()
assert start.elapsed_time(end) >= 0 and torch.equal(on_side.cpu(), host)
print("ok streams and events", flush=True)

torch.cuda.memory._record_memory_history(max_entries=1000)
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256))
model = model.cuda()
optimizer = torch.optim.Adam(model.parameters())
for _ in range(3):
    model(torch.randn(64, 256, device="cuda")).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
torch.cuda.synchronize()
print("ok training step", flush=True)

for dtype in (torch.bfloat16, torch.float16):
    with torch.autocast("cuda", dtype=dtype):
        loss = model(torch.randn(64, 256, device="cuda")).float().sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
torch.cuda.synchronize()
print("ok autocast", flush=True)

snapshot = torch.cuda.memory._snapshot()
assert snapshot["segments"] and snapshot["device_traces"][0], snapshot.keys()
torch.cuda.memory._record_memory_history(enabled=None)
print("ok memory history", len(snapshot["segments"]), "segments", flush=True)

free, total = torch.cuda.mem_get_info()
assert 0 < free < total and torch.cuda.memory_reserved() > 0
print("ok mem_get_info", flush=True)
print("done", flush=True)
