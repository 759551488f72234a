// The caching pool under the GPU backend's device memory: the bookkeeping of PyTorch's CUDA caching
// allocator (c10/cuda/CUDACachingAllocator.cpp), without CUDA, so that it is tested on the CPU.
//
// Raw memory comes in segments from a SegmentSource (cudaMalloc on the GPU, operator new on the
// host) and is never given back while the program runs, except by release_cached() or when a new
// segment would cross the limit. Requests are carved out of the segments as blocks:
// - every request is rounded up to a multiple of 512 B (at least 512 B);
// - a rounded request of at most 1 MiB is "small" and served from 2 MiB segments; a larger one
//   from 20 MiB segments when it is below 10 MiB, else from a segment of the request rounded up to
//   2 MiB. Small and large blocks never mix: each has its own pool of free blocks;
// - best fit: the smallest free block of the request's pool that holds it, the lowest address
//   among equal sizes;
// - a block larger than the request is split when the rest is at least 512 B (small pool) or more
//   than 1 MiB (large pool); otherwise the caller gets the whole block;
// - a freed block merges with the free blocks on either side of it in its segment;
// - a request that needs a new segment which would cross the limit first releases every segment
//   that is entirely free, then tries once more, and throws PoolExhausted if it still cannot. The
//   same release-and-retry happens once when the source itself refuses (std::bad_alloc).
//
// Stream safety without CUDA: memory freed while streams may still use it carries "fences" (an
// event recorded on each stream that used it; opaque pointers here). PyTorch keeps such a block out
// of the pool until its events complete; this pool instead hands the fences to the next user, who
// makes its own stream wait for them (cudaStreamWaitEvent) before using the memory. A free block
// keeps at most one fence per stream, the one recorded last: waiting for it covers everything the
// stream did before (stream order). Every copy of an event is counted, the caller's included, so
// that an event is recycled only when no block and no caller can still wait for it.
//
// Thread-safe: one mutex around every call (frees may come from a communication thread).
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <unordered_map>
#include <vector>

namespace shardplan::kernels {

// Raw memory in segments. map throws on failure: std::bad_alloc (or a class derived from it) when
// the memory is not there, so that the pool releases its cached segments and retries; anything
// else for other failures, which the pool lets through.
class SegmentSource {
public:
  virtual ~SegmentSource() = default;
  virtual void* map(std::int64_t bytes) = 0;
  virtual void unmap(void* p, std::int64_t bytes) noexcept = 0;
};

// Host memory as segments: aligned operator new, 512 B like the pool's blocks. With a capacity it
// stands for a device of that size: a map that would hold more than `capacity_bytes` in all throws
// std::bad_alloc, as cudaMalloc fails with cudaErrorMemoryAllocation.
class HostSegmentSource final : public SegmentSource {
public:
  static constexpr std::int64_t kUnlimited = std::numeric_limits<std::int64_t>::max();
  explicit HostSegmentSource(std::int64_t capacity_bytes = kUnlimited);
  void* map(std::int64_t bytes) override;
  void unmap(void* p, std::int64_t bytes) noexcept override;
  std::int64_t mapped_bytes() const;  // held now

private:
  mutable std::mutex mutex_;
  std::int64_t capacity_;
  std::int64_t mapped_ = 0;
};

// "Memory recorded by this event on this stream": both opaque (cudaStream_t, cudaEvent_t).
struct Fence {
  void* stream = nullptr;
  void* event = nullptr;
};

// A request that needs a new segment which the limit does not allow, even after every free segment
// was released. what() is one line, e.g. "memory pool: a request of 3145728 bytes (3.00 MiB) needs
// a new segment of 20971520 bytes (20.00 MiB), which with 8388608 bytes (8.00 MiB) reserved would
// exceed the limit of 16777216 bytes (16.00 MiB)".
class PoolExhausted : public std::runtime_error {
public:
  PoolExhausted(std::int64_t requested_bytes, std::int64_t segment_bytes,
                std::int64_t reserved_bytes, std::int64_t limit_bytes);
  std::int64_t requested_bytes() const { return requested_; }
  std::int64_t segment_bytes() const { return segment_; }
  std::int64_t reserved_bytes() const { return reserved_; }
  std::int64_t limit_bytes() const { return limit_; }

private:
  std::int64_t requested_;
  std::int64_t segment_;
  std::int64_t reserved_;
  std::int64_t limit_;
};

// The pool's counters, bytes unless named otherwise.
struct PoolStats {
  std::int64_t allocated_bytes = 0;       // blocks handed out now (rounded sizes, unsplit rests)
  std::int64_t peak_allocated_bytes = 0;  // highest allocated_bytes since construction/reset_peaks
  std::int64_t reserved_bytes = 0;        // segments held now (PyTorch's "reserved")
  std::int64_t peak_reserved_bytes = 0;   // highest reserved_bytes since construction/reset_peaks
  std::int64_t segments = 0;              // segments held now
  std::int64_t maps = 0;                  // SegmentSource::map calls that succeeded (cudaMalloc)
  std::int64_t unmaps = 0;                // segments given back (cudaFree)
  std::int64_t limit_bytes = 0;           // most reserved bytes allowed
};

class CachingPool {
public:
  static constexpr std::int64_t kUnlimited = std::numeric_limits<std::int64_t>::max();

  // PyTorch's constants (CUDACachingAllocator.cpp: kMinBlockSize, kSmallSize, kSmallBuffer,
  // kLargeBuffer, kMinLargeAlloc, kRoundLarge).
  static constexpr std::int64_t kMinBlockBytes = 512;                // rounding of every request
  static constexpr std::int64_t kSmallRequestBytes = 1 << 20;        // largest small request
  static constexpr std::int64_t kSmallSegmentBytes = 2 << 20;        // segment of the small pool
  static constexpr std::int64_t kLargeSegmentBytes = 20 << 20;       // shared large segment
  static constexpr std::int64_t kMinOwnSegmentBytes = 10 << 20;      // from here: own segment
  static constexpr std::int64_t kOwnSegmentRoundingBytes = 2 << 20;  // rounding of that segment
  // Larger requests are refused (std::invalid_argument): no device has 2^50 bytes, and every size
  // arithmetic below stays far from overflowing.
  static constexpr std::int64_t kMaxRequestBytes = std::int64_t{1} << 50;

  // `bytes` rounded up to a multiple of 512, at least 512.
  static std::int64_t rounded_size(std::int64_t bytes);
  // The size of the segment a new segment for a request of `rounded` bytes gets.
  static std::int64_t segment_size(std::int64_t rounded);
  // Whether a request of `rounded` bytes belongs to the small pool.
  static bool is_small(std::int64_t rounded) { return rounded <= kSmallRequestBytes; }

  struct Allocation {
    void* ptr = nullptr;
    std::int64_t bytes = 0;     // the block's size: the rounded request, or more (unsplit rest)
    std::vector<Fence> fences;  // make the allocating stream wait for each, then release_fences
  };

  // The source must outlive the pool. limit_bytes: the most bytes of segments held at once.
  explicit CachingPool(SegmentSource& source, std::int64_t limit_bytes = kUnlimited);
  CachingPool(const CachingPool&) = delete;
  CachingPool& operator=(const CachingPool&) = delete;
  // Unmaps every segment, blocks still handed out included (their owners must be gone).
  ~CachingPool();

  // A block of at least `bytes` (> 0, rounded) for use on `stream` (kept as the block's allocating
  // stream, first in streams_of). The fences of every block merged into it since it was last
  // handed out are returned, those of `stream` itself included (stream order covers them: the
  // caller skips the wait but still hands them back with release_fences). Throws PoolExhausted
  // (the limit), what SegmentSource::map throws (after the release-and-retry), or
  // std::invalid_argument for a bytes <= 0 or > kMaxRequestBytes.
  Allocation allocate(std::int64_t bytes, void* stream);

  // PyTorch's record_stream: the block `ptr` (handed out, not yet freed) is used by `stream` too,
  // so a free must fence that stream as well. Throws std::invalid_argument for any other pointer.
  void record_use(void* ptr, void* stream);
  // The streams that use the block `ptr`: its allocating stream, then the recorded ones, each
  // once. Throws std::invalid_argument for a pointer not handed out.
  std::vector<void*> streams_of(void* ptr) const;

  // Gives the block `ptr` back with a fence for each stream that may still use it. Fences of one
  // stream must come in the order they were recorded (a later free() call, a later event on that
  // stream): the pool keeps only the last one per stream. Throws std::invalid_argument for a
  // pointer not handed out (or already freed); then nothing changes.
  void free(void* ptr, const std::vector<Fence>& fences);

  // The caller has made its stream wait for these fences (from an Allocation), or skipped them:
  // it holds them no longer. Throws std::invalid_argument for an event the pool does not count.
  void release_fences(const std::vector<Fence>& fences);
  // Events that no block and no caller holds any more (each returned once): free to record again.
  std::vector<void*> take_unused_events();

  // Unmaps every segment that is one free block; returns the bytes given back.
  std::int64_t release_cached();

  void set_limit(std::int64_t limit_bytes);  // >= 0; segments already held are kept
  std::int64_t limit() const;
  PoolStats stats() const;
  void reset_peaks();  // peaks start again from the current values

private:
  struct Block;
  struct BySizeThenAddress {
    bool operator()(const Block* a, const Block* b) const;
  };
  using FreeBlocks = std::set<Block*, BySizeThenAddress>;

  // Every private member below runs with mutex_ held.
  FreeBlocks& free_blocks(bool small) { return small ? small_free_ : large_free_; }
  void new_segment(std::int64_t requested, std::int64_t rounded);
  std::int64_t release_free_segments();
  void keep_fence(Block& block, const Fence& fence, std::uint64_t order);
  void drop_event(void* event);
  Block* merge(Block* low, Block* high);

  mutable std::mutex mutex_;
  SegmentSource& source_;
  std::unordered_map<char*, std::unique_ptr<Block>> blocks_;  // every block, by its address
  std::map<char*, std::int64_t> segments_;                    // base address -> size (bytes)
  FreeBlocks small_free_;
  FreeBlocks large_free_;
  std::unordered_map<void*, std::int64_t> event_copies_;  // event -> copies held (blocks, callers)
  std::vector<void*> unused_events_;
  std::uint64_t free_calls_ = 0;  // orders the fences of one stream
  PoolStats stats_;
};

}  // namespace shardplan::kernels
