// Prints the layout of c10::CachingDeviceAllocator::TraceEntry and of the std::function that
// carries it, from the pinned torch's own headers: the real-PyTorch tier compares these with
// what liboomtrace's trace tracker reads (shim/src/torch_tracker.rs), so that a torch bump that
// moves a field fails a test instead of recording garbage.
#include <c10/core/CachingDeviceAllocator.h>

#include <cstddef>
#include <cstdio>
#include <functional>

using c10::CachingDeviceAllocator::TraceEntry;

int main() {
  std::printf("action %zu\n", offsetof(TraceEntry, action_));
  std::printf("device %zu\n", offsetof(TraceEntry, device_));
  std::printf("addr %zu\n", offsetof(TraceEntry, addr_));
  std::printf("stream %zu\n", offsetof(TraceEntry, stream_));
  std::printf("size %zu\n", offsetof(TraceEntry, size_));
  std::printf("sizeof_device %zu\n", sizeof(TraceEntry::device_));
  std::printf("function %zu\n", sizeof(std::function<void(const TraceEntry&)>));
  std::printf("ALLOC %d\n", static_cast<int>(TraceEntry::ALLOC));
  std::printf("FREE_COMPLETED %d\n", static_cast<int>(TraceEntry::FREE_COMPLETED));
  std::printf("SEGMENT_ALLOC %d\n", static_cast<int>(TraceEntry::SEGMENT_ALLOC));
  std::printf("SEGMENT_FREE %d\n", static_cast<int>(TraceEntry::SEGMENT_FREE));
  std::printf("SEGMENT_MAP %d\n", static_cast<int>(TraceEntry::SEGMENT_MAP));
  std::printf("SEGMENT_UNMAP %d\n", static_cast<int>(TraceEntry::SEGMENT_UNMAP));
  std::printf("OOM %d\n", static_cast<int>(TraceEntry::OOM));
  return 0;
}
