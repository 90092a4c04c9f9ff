// Prints the layout of PyTorch's allocator TraceEntry and of the std::function that carries
// it, from the torch under test's own headers: the real-PyTorch tier compares these with what
// liboomtrace's trace tracker reads (shim/src/torch_tracker.rs), so that a release that moves
// a field fails a test instead of recording garbage. Also what the wrappers of the allocator's
// methods read (shim/src/torch_allocator.rs): a DataPtr's four words, and the CUDAStream that
// getCurrentCUDAStream returns in registers. TE_HEADER is the header that declares
// TraceEntry in that release, TE_NS its namespace (c10::cuda::CUDACachingAllocator up to 2.10,
// c10::CachingDeviceAllocator from 2.11 on).
#include TE_HEADER
#include <c10/core/Allocator.h>
#include <c10/cuda/CUDAStream.h>

#include <cstddef>
#include <cstdio>
#include <functional>
#include <type_traits>

using TE_NS::TraceEntry;

static void deleter(void*) {}

int main() {
  std::printf("action %zu\n", offsetof(TraceEntry, action_));
  std::printf("device %zu\n", offsetof(TraceEntry, device_));
  std::printf("addr %zu\n", offsetof(TraceEntry, addr_));
  std::printf("stream %zu\n", offsetof(TraceEntry, stream_));
  std::printf("size %zu\n", offsetof(TraceEntry, size_));
  std::printf("sizeof_action %zu\n", sizeof(TraceEntry::action_));
  std::printf("sizeof_device %zu\n", sizeof(TraceEntry::device_));
  std::printf("function %zu\n", sizeof(std::function<void(const TraceEntry&)>));
  std::printf("tracker_is_function %d\n",
              static_cast<int>(std::is_same<TE_NS::AllocatorTraceTracker,
                                            std::function<void(const TraceEntry&)>>::value));
  std::printf("ALLOC %d\n", static_cast<int>(TraceEntry::ALLOC));
  std::printf("FREE_REQUESTED %d\n", static_cast<int>(TraceEntry::FREE_REQUESTED));
  std::printf("FREE_COMPLETED %d\n", static_cast<int>(TraceEntry::FREE_COMPLETED));
  std::printf("SEGMENT_ALLOC %d\n", static_cast<int>(TraceEntry::SEGMENT_ALLOC));
  std::printf("SEGMENT_FREE %d\n", static_cast<int>(TraceEntry::SEGMENT_FREE));
  std::printf("SEGMENT_MAP %d\n", static_cast<int>(TraceEntry::SEGMENT_MAP));
  std::printf("SEGMENT_UNMAP %d\n", static_cast<int>(TraceEntry::SEGMENT_UNMAP));
  std::printf("OOM %d\n", static_cast<int>(TraceEntry::OOM));
  {
    c10::DataPtr p(reinterpret_cast<void*>(0x1000), reinterpret_cast<void*>(0x2000), &deleter,
                   c10::Device(c10::DeviceType::CUDA, 3));
    const unsigned long* w = reinterpret_cast<const unsigned long*>(&p);
    std::printf("data_ptr_size %zu\n", sizeof(c10::DataPtr));
    std::printf("data_ptr_words %lx %lx %lx %lx\n", w[0], w[1], w[2], w[3] & 0xffff);
    std::printf("deleter %lx\n", reinterpret_cast<unsigned long>(&deleter));
  }
  std::printf("cuda_stream_size %zu\n", sizeof(c10::cuda::CUDAStream));
  std::printf("cuda_stream_trivial %d\n",
              static_cast<int>(std::is_trivially_copyable<c10::cuda::CUDAStream>::value));
  return 0;
}
