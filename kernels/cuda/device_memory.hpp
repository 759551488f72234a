// The GPU backend's device memory: a MemorySource (kernels/memory_source.hpp) over the caching
// pool of kernels/caching_pool.hpp, whose segments come from cudaMalloc on one device.
//
// Streams (PyTorch's semantics, c10/cuda/CUDACachingAllocator.cpp and Tensor.record_stream):
// - a block is allocated for one stream, the memory's current stream (set_stream, StreamScope), or
//   a given one (allocate_on);
// - record_use(p, s) says that stream s uses the block too;
// - free(p) queues nothing and does not wait: it records one event on each stream that used the
//   block (the allocating one and the recorded ones) and leaves them with the block as fences;
// - whoever gets that memory next makes its stream wait for the fences of the other streams
//   (cudaStreamWaitEvent: on the device, the host does not wait), so no kernel touches it before
//   the earlier users are done. Same-stream reuse needs no wait: the stream's order covers it.
// Events are created once (cudaEventDisableTiming) and recorded again when the pool says no block
// and no caller can still wait for them. Streams must outlive the blocks they use.
//
// Counts (PyTorch's torch.cuda.memory_reserved / memory_allocated): reserved = the segments held
// (what cudaMemGetInfo sees of this pool), allocated = the blocks handed out (rounded requests).
// What else the device holds (used_by_others) is the CUDA context, cuBLAS's workspace, NCCL's
// buffers and other processes: the planner's "context and NCCL workspace" term.
//
// Thread-safe: frees may come from another thread than allocations. Entry points switch the
// calling thread to the memory's device for their CUDA calls and back.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "kernels/caching_pool.hpp"
#include "kernels/memory_source.hpp"

namespace shardplan::kernels::cuda {

// cudaMalloc refused (cudaErrorMemoryAllocation): a std::bad_alloc, so that the pool releases its
// cached segments and tries once more. what() is one line naming the size and the device.
class DeviceOutOfMemory : public std::bad_alloc {
public:
  DeviceOutOfMemory(std::int64_t bytes, int device);
  const char* what() const noexcept override { return message_.c_str(); }

private:
  std::string message_;
};

// Segments from cudaMalloc on `device`. map throws DeviceOutOfMemory when the device has no room,
// std::runtime_error for any other failure. unmap synchronizes the device before cudaFree: the
// segment's last free blocks may carry fences of work still queued (PyTorch waits for its blocks'
// events before it releases cached segments); a failure there is kept for take_error().
class CudaSegmentSource final : public SegmentSource {
public:
  explicit CudaSegmentSource(int device) : device_(device) {}
  void* map(std::int64_t bytes) override;
  void unmap(void* p, std::int64_t bytes) noexcept override;
  std::string take_error();  // the first failure of unmap since the last call ("" when none)

private:
  int device_;
  std::mutex mutex_;
  std::string error_;
};

// cudaMemGetInfo around one step of the program (bytes).
struct DeviceMemoryInfo {
  std::int64_t total = 0;                                           // the device's memory
  std::int64_t free_before = 0;                                     // free before the step
  std::int64_t free_after = 0;                                      // free after it
  std::int64_t growth() const { return free_before - free_after; }  // what the step took
};

class DeviceMemory final : public MemorySource {
public:
  // On the current device (cudaSetDevice first). limit_bytes: the most bytes of segments held at
  // once (executor --gpu-memory-GiB); crossing it throws PoolExhausted. The current stream starts
  // as the legacy default stream (0).
  explicit DeviceMemory(std::int64_t limit_bytes = CachingPool::kUnlimited);
  // Waits for the device, destroys the events, frees every segment. Blocks must be freed before.
  ~DeviceMemory() override;

  // ---- MemorySource, on the current stream
  // A block of `bytes` for the current stream, zeroed with cudaMemsetAsync on it when `zero`.
  // Throws PoolExhausted (the limit), DeviceOutOfMemory (the device), std::runtime_error for other
  // CUDA failures, including one an earlier free could not report.
  void* allocate(std::int64_t bytes, bool zero) override;
  // Fences the block on every stream that used it and gives it back to the pool; never waits. A
  // CUDA failure here waits for those streams instead (or, if that fails too, keeps the block out
  // of the pool) and is thrown by the next allocate.
  void free(void* data, std::int64_t bytes) noexcept override;
  bool host_accessible() const override { return false; }
  // Host <-> device copies on the current stream, complete when they return.
  void write(void* dst, const void* host, std::int64_t bytes) override;
  void read(void* host, const void* src, std::int64_t bytes) override;
  // Device -> device on the current stream, not waited for. Overlapping regions go through a
  // staging block of at most kStagingBytes from the pool, piece by piece in the safe direction.
  void copy(void* dst, const void* src, std::int64_t bytes) override;
  static constexpr std::int64_t kStagingBytes = 4 << 20;

  // As allocate, for `stream` instead of the current stream.
  void* allocate_on(cudaStream_t stream, std::int64_t bytes, bool zero);

  // The stream allocations are made for (and copies queued on) from now on.
  void set_stream(cudaStream_t stream);
  cudaStream_t stream() const;
  // Allocations on another stream for a scope: sets it, and the previous one back on destruction.
  class StreamScope {
  public:
    StreamScope(DeviceMemory& memory, cudaStream_t stream)
        : memory_(memory), previous_(memory.stream()) {
      memory.set_stream(stream);
    }
    ~StreamScope() { memory_.set_stream(previous_); }
    StreamScope(const StreamScope&) = delete;
    StreamScope& operator=(const StreamScope&) = delete;

  private:
    DeviceMemory& memory_;
    cudaStream_t previous_;
  };

  // PyTorch's record_stream: the block `p` is used by `stream` too; its free will fence `stream`.
  // Throws std::invalid_argument for a pointer this memory has not handed out.
  void record_use(void* p, cudaStream_t stream);

  void set_limit(std::int64_t limit_bytes);
  std::int64_t limit() const;
  // Frees every cached segment that holds no block (after waiting for the device); returns bytes.
  std::int64_t release_cached();
  void reset_peaks();

  PoolStats stats() const;
  std::int64_t reserved_bytes() const { return stats().reserved_bytes; }
  std::int64_t peak_reserved_bytes() const { return stats().peak_reserved_bytes; }
  std::int64_t allocated_bytes() const { return stats().allocated_bytes; }
  std::int64_t peak_allocated_bytes() const { return stats().peak_allocated_bytes; }
  std::int64_t segments() const { return stats().segments; }
  std::int64_t maps() const { return stats().maps; }  // cudaMalloc calls
  int device() const { return device_; }

  // What the device has in use (cudaMemGetInfo: total - free) that this pool does not hold: the
  // CUDA context, cuBLAS's workspace, NCCL's buffers, other processes on the same GPU.
  std::int64_t used_by_others() const;
  // cudaMemGetInfo on the current device before and after `step`. The NCCL workspace is the
  // growth across communicator initialisation (ncclCommInitRank and its first collective).
  static DeviceMemoryInfo measure(const std::function<void()>& step);
  // The CUDA context: total - free right after cudaSetDevice and cudaFree(0) (which creates the
  // context), to be called before anything is allocated on the device. Memory of other processes
  // on the same GPU is counted too.
  static std::int64_t context_bytes();

private:
  cudaEvent_t take_event();                        // mutex_ held
  void recycle(const std::vector<void*>& events);  // mutex_ not held
  void throw_deferred_error();                     // mutex_ not held

  int device_;
  CudaSegmentSource source_;  // before pool_: the pool unmaps into it when destroyed
  CachingPool pool_;
  mutable std::mutex mutex_;  // stream_, the events, deferred_error_; orders the frees
  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> free_events_;  // recorded by nobody: ready to record
  std::vector<cudaEvent_t> all_events_;   // every event created, destroyed at the end
  std::string deferred_error_;            // the first failure of a free, for the next allocate
};

}  // namespace shardplan::kernels::cuda
