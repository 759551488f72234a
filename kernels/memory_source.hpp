// Where the tracked allocator's bytes come from: the process's heap for the CPU backend, the GPU's
// caching pool for the CUDA backend (kernels/cuda/device_memory.hpp). The TrackedAllocator counts
// what is requested by category and enforces the capacity; a source only hands out raw memory.
#pragma once

#include <cstdint>

namespace shardplan::kernels {

class MemorySource {
public:
  MemorySource() = default;
  MemorySource(const MemorySource&) = delete;
  MemorySource& operator=(const MemorySource&) = delete;
  virtual ~MemorySource() = default;

  // `bytes` > 0 of raw memory, zeroed when `zero`. Throws when the source has none left.
  virtual void* allocate(std::int64_t bytes, bool zero) = 0;
  virtual void free(void* data, std::int64_t bytes) noexcept = 0;
  // Whether the host may read and write the memory (false for device memory).
  virtual bool host_accessible() const = 0;
  // Copies between the host and this source's memory, complete when they return (after the work
  // queued before them on the source's stream, for device memory).
  virtual void write(void* dst, const void* host, std::int64_t bytes) = 0;
  virtual void read(void* host, const void* src, std::int64_t bytes) = 0;
  // Copies `bytes` within this source's memory (regions may overlap). On a device it is queued on
  // the source's current stream and does not wait.
  virtual void copy(void* dst, const void* src, std::int64_t bytes) = 0;
};

// 64-byte aligned blocks of the process's heap (cache-line alignment, as cudaMalloc's 256 B is for
// the GPU: vector loads never split a line). The default source.
class HostMemory final : public MemorySource {
public:
  void* allocate(std::int64_t bytes, bool zero) override;
  void free(void* data, std::int64_t bytes) noexcept override;
  bool host_accessible() const override { return true; }
  void write(void* dst, const void* host, std::int64_t bytes) override;
  void read(void* host, const void* src, std::int64_t bytes) override;
  void copy(void* dst, const void* src, std::int64_t bytes) override;
};

}  // namespace shardplan::kernels
