// Host memory for a rank whose collectives run on their own threads (comm/host_stream.hpp): the
// heap, with PyTorch's rule for memory that other streams use (Tensor.record_stream;
// c10/cuda/CUDACachingAllocator.cpp): a block freed while a collective stream may still read or
// write it goes back to the heap only once that stream has done what it had queued at the free.
// The streams that use a block are the one it was allocated for (set_stream, the backend's
// allocate_on) and those record_use names; the compute thread itself never needs a wait.
#pragma once

#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "comm/host_stream.hpp"
#include "kernels/memory_source.hpp"

namespace shardplan::kernels {

class StreamOrderedHostMemory final : public MemorySource {
public:
  StreamOrderedHostMemory() = default;
  // Waits for the streams of the blocks still held back, then frees them. The streams must still
  // be alive.
  ~StreamOrderedHostMemory() override;

  // The stream the allocations that follow are for (nullptr: the computing thread).
  void set_stream(comm::HostStream* stream);
  // The block at p (allocated here, not yet freed) is used by `stream` too.
  void record_use(const void* p, comm::HostStream* stream);

  void* allocate(std::int64_t bytes, bool zero) override;
  void free(void* data, std::int64_t bytes) noexcept override;
  bool host_accessible() const override { return true; }
  void write(void* dst, const void* host, std::int64_t bytes) override;
  void read(void* host, const void* src, std::int64_t bytes) override;
  void copy(void* dst, const void* src, std::int64_t bytes) override;

  // Blocks freed but held back for their streams, now (for tests).
  std::size_t held_back() const;

private:
  struct Fence {
    comm::HostStream* stream;
    std::uint64_t ticket;
  };
  struct Held {
    void* data;
    std::int64_t bytes;
    std::vector<Fence> fences;
  };
  void release_done();  // mutex_ held

  mutable std::mutex mutex_;
  HostMemory heap_;
  comm::HostStream* stream_ = nullptr;
  std::unordered_map<const void*, std::vector<comm::HostStream*>> users_;  // live blocks' streams
  std::vector<Held> held_;
};

}  // namespace shardplan::kernels
