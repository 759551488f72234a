#include "kernels/caching_pool.hpp"

#include <algorithm>
#include <functional>
#include <new>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace shardplan::kernels {
namespace {

// Host segments are aligned like the pool's blocks, so that every block is 512 B aligned
// (cudaMalloc gives at least 256 B).
constexpr std::align_val_t kHostSegmentAlignment{512};

std::string describe_bytes(std::int64_t bytes) {
  constexpr double kMiB = 1024.0 * 1024.0;
  const double value = static_cast<double>(bytes);
  if (bytes < (std::int64_t{1} << 30))
    return fmt::format("{} bytes ({:.2f} MiB)", bytes, value / kMiB);
  return fmt::format("{} bytes ({:.2f} GiB)", bytes, value / (kMiB * 1024.0));
}

}  // namespace

// A piece of one segment. Free blocks sit in their pool's set (small_free_ or large_free_),
// ordered by size then address; handed-out blocks are only in blocks_.
struct CachingPool::Block {
  struct HeldFence {
    Fence fence;
    std::uint64_t order = 0;  // the free() call that brought it: later = recorded later
  };
  char* ptr = nullptr;
  std::int64_t size = 0;  // bytes, a multiple of 512
  bool small = false;     // which pool (fixed by the segment)
  bool allocated = false;
  Block* prev = nullptr;    // the block just below in the same segment (nullptr: segment start)
  Block* next = nullptr;    // the block just above in the same segment (nullptr: segment end)
  void* stream = nullptr;   // handed out: the allocating stream
  std::vector<void*> uses;  // handed out: other streams recorded with record_use
  std::vector<HeldFence> fences;  // free: at most one per stream
};

bool CachingPool::BySizeThenAddress::operator()(const Block* a, const Block* b) const {
  if (a->size != b->size) return a->size < b->size;
  return std::less<const char*>{}(a->ptr, b->ptr);
}

HostSegmentSource::HostSegmentSource(std::int64_t capacity_bytes) : capacity_(capacity_bytes) {
  if (capacity_bytes < 0)
    throw std::invalid_argument(
        fmt::format("host segment source: capacity must be >= 0, got {}", capacity_bytes));
}

void* HostSegmentSource::map(std::int64_t bytes) {
  if (bytes <= 0)
    throw std::invalid_argument(fmt::format("host segment source: cannot map {} bytes", bytes));
  std::lock_guard lock(mutex_);
  if (bytes > capacity_ - mapped_) throw std::bad_alloc();
  void* p = ::operator new(static_cast<std::size_t>(bytes), kHostSegmentAlignment);
  mapped_ += bytes;
  return p;
}

void HostSegmentSource::unmap(void* p, std::int64_t bytes) noexcept {
  ::operator delete(p, kHostSegmentAlignment);
  std::lock_guard lock(mutex_);
  mapped_ -= bytes;
}

std::int64_t HostSegmentSource::mapped_bytes() const {
  std::lock_guard lock(mutex_);
  return mapped_;
}

PoolExhausted::PoolExhausted(std::int64_t requested_bytes, std::int64_t segment_bytes,
                             std::int64_t reserved_bytes, std::int64_t limit_bytes)
    : std::runtime_error(fmt::format(
          "memory pool: a request of {} needs a new segment of {}, which with {} reserved would "
          "exceed the limit of {}",
          describe_bytes(requested_bytes), describe_bytes(segment_bytes),
          describe_bytes(reserved_bytes), describe_bytes(limit_bytes))),
      requested_(requested_bytes), segment_(segment_bytes), reserved_(reserved_bytes),
      limit_(limit_bytes) {}

std::int64_t CachingPool::rounded_size(std::int64_t bytes) {
  // round_size in CUDACachingAllocator.cpp: a multiple of kMinBlockSize, at least one.
  if (bytes <= kMinBlockBytes) return kMinBlockBytes;
  return (bytes + kMinBlockBytes - 1) / kMinBlockBytes * kMinBlockBytes;
}

std::int64_t CachingPool::segment_size(std::int64_t rounded) {
  // get_allocation_size in CUDACachingAllocator.cpp.
  if (rounded <= kSmallRequestBytes) return kSmallSegmentBytes;
  if (rounded < kMinOwnSegmentBytes) return kLargeSegmentBytes;
  return (rounded + kOwnSegmentRoundingBytes - 1) / kOwnSegmentRoundingBytes *
         kOwnSegmentRoundingBytes;
}

CachingPool::CachingPool(SegmentSource& source, std::int64_t limit_bytes) : source_(source) {
  if (limit_bytes < 0)
    throw std::invalid_argument(
        fmt::format("memory pool: limit must be >= 0, got {}", limit_bytes));
  stats_.limit_bytes = limit_bytes;
}

CachingPool::~CachingPool() {
  for (const auto& [base, size] : segments_) source_.unmap(base, size);
}

CachingPool::Allocation CachingPool::allocate(std::int64_t bytes, void* stream) {
  if (bytes <= 0 || bytes > kMaxRequestBytes)
    throw std::invalid_argument(fmt::format("memory pool: cannot allocate {} bytes", bytes));
  const std::int64_t rounded = rounded_size(bytes);
  const bool small = is_small(rounded);
  std::lock_guard lock(mutex_);
  FreeBlocks& pool = free_blocks(small);

  // Best fit: the first free block in (size, address) order that is not smaller than the request.
  Block key;
  key.size = rounded;
  auto found = pool.lower_bound(&key);
  if (found == pool.end()) {
    new_segment(bytes, rounded);  // a free block of the segment's size, in `pool`
    found = pool.lower_bound(&key);
  }
  Block* block = *found;
  pool.erase(found);

  // should_split in CUDACachingAllocator.cpp: the rest becomes a free block of its own when it is
  // at least kMinBlockSize (small pool) or more than kSmallSize (large pool).
  const std::int64_t rest = block->size - rounded;
  const bool split = small ? rest >= kMinBlockBytes : rest > kSmallRequestBytes;
  if (split) {
    auto tail = std::make_unique<Block>();
    tail->ptr = block->ptr + rounded;
    tail->size = rest;
    tail->small = small;
    tail->prev = block;
    tail->next = block->next;
    // The rest is memory the fenced streams may still use: it keeps a copy of every fence.
    tail->fences = block->fences;
    for (const auto& held : tail->fences) ++event_copies_[held.fence.event];
    if (block->next) block->next->prev = tail.get();
    block->next = tail.get();
    block->size = rounded;
    pool.insert(tail.get());
    blocks_.emplace(tail->ptr, std::move(tail));
  }

  block->allocated = true;
  block->stream = stream;
  block->uses.clear();
  Allocation result;
  result.ptr = block->ptr;
  result.bytes = block->size;
  result.fences.reserve(block->fences.size());
  for (const auto& held : block->fences) result.fences.push_back(held.fence);  // copies move out
  block->fences.clear();
  stats_.allocated_bytes += block->size;
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  return result;
}

void CachingPool::new_segment(std::int64_t requested, std::int64_t rounded) {
  const std::int64_t size = segment_size(rounded);
  bool released = false;
  if (size > stats_.limit_bytes - stats_.reserved_bytes) {
    // As PyTorch does when cudaMalloc fails or the memory fraction would be crossed: give back
    // the cached segments nobody uses, then try once more.
    release_free_segments();
    released = true;
    if (size > stats_.limit_bytes - stats_.reserved_bytes)
      throw PoolExhausted(requested, size, stats_.reserved_bytes, stats_.limit_bytes);
  }
  void* raw = nullptr;
  try {
    raw = source_.map(size);
  } catch (const std::bad_alloc&) {
    if (released || release_free_segments() == 0) throw;
    raw = source_.map(size);
  }
  char* base = static_cast<char*>(raw);
  try {
    auto block = std::make_unique<Block>();
    block->ptr = base;
    block->size = size;
    block->small = is_small(rounded);
    Block* fresh = block.get();
    blocks_.emplace(base, std::move(block));
    segments_.emplace(base, size);
    free_blocks(fresh->small).insert(fresh);  // last: when it throws, the set is unchanged
  } catch (...) {
    // Only the host's own bookkeeping can fail here: undo it and give the segment back.
    segments_.erase(base);
    blocks_.erase(base);
    source_.unmap(raw, size);
    throw;
  }
  stats_.reserved_bytes += size;
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
  ++stats_.segments;
  ++stats_.maps;
}

std::int64_t CachingPool::release_free_segments() {
  std::int64_t released = 0;
  for (auto it = segments_.begin(); it != segments_.end();) {
    const auto [base, size] = *it;
    Block* block = blocks_.at(base).get();
    if (block->allocated || block->size != size) {  // something in it is handed out
      ++it;
      continue;
    }
    free_blocks(block->small).erase(block);
    for (const auto& held : block->fences) drop_event(held.fence.event);
    blocks_.erase(base);
    source_.unmap(base, size);
    stats_.reserved_bytes -= size;
    --stats_.segments;
    ++stats_.unmaps;
    released += size;
    it = segments_.erase(it);
  }
  return released;
}

void CachingPool::record_use(void* ptr, void* stream) {
  std::lock_guard lock(mutex_);
  auto found = blocks_.find(static_cast<char*>(ptr));
  if (found == blocks_.end() || !found->second->allocated)
    throw std::invalid_argument("memory pool: record_use of a pointer it has not handed out");
  Block& block = *found->second;
  if (stream == block.stream || std::ranges::find(block.uses, stream) != block.uses.end()) return;
  block.uses.push_back(stream);
}

std::vector<void*> CachingPool::streams_of(void* ptr) const {
  std::lock_guard lock(mutex_);
  auto found = blocks_.find(static_cast<char*>(ptr));
  if (found == blocks_.end() || !found->second->allocated)
    throw std::invalid_argument("memory pool: streams_of a pointer it has not handed out");
  std::vector<void*> streams{found->second->stream};
  streams.insert(streams.end(), found->second->uses.begin(), found->second->uses.end());
  return streams;
}

void CachingPool::free(void* ptr, const std::vector<Fence>& fences) {
  std::lock_guard lock(mutex_);
  auto found = blocks_.find(static_cast<char*>(ptr));
  if (found == blocks_.end() || !found->second->allocated)
    throw std::invalid_argument("memory pool: free of a pointer it has not handed out");
  for (const auto& fence : fences)
    if (fence.event == nullptr)
      throw std::invalid_argument("memory pool: free with a fence that has no event");
  Block* block = found->second.get();
  const std::uint64_t order = ++free_calls_;
  block->allocated = false;
  block->stream = nullptr;
  block->uses.clear();
  stats_.allocated_bytes -= block->size;
  for (const auto& fence : fences) {
    ++event_copies_[fence.event];  // the caller's copy becomes the block's
    keep_fence(*block, fence, order);
  }
  // free_block in CUDACachingAllocator.cpp: merge with the free neighbours of the same segment.
  // A neighbour leaves its pool before its size changes (the pool is ordered by size).
  if (block->prev && !block->prev->allocated) {
    free_blocks(block->small).erase(block->prev);
    block = merge(block->prev, block);
  }
  if (block->next && !block->next->allocated) {
    free_blocks(block->small).erase(block->next);
    block = merge(block, block->next);
  }
  free_blocks(block->small).insert(block);
}

CachingPool::Block* CachingPool::merge(Block* low, Block* high) {
  low->size += high->size;
  low->next = high->next;
  if (high->next) high->next->prev = low;
  for (const auto& held : high->fences) keep_fence(*low, held.fence, held.order);
  blocks_.erase(high->ptr);  // destroys high
  return low;
}

void CachingPool::keep_fence(Block& block, const Fence& fence, std::uint64_t order) {
  // The copy is already counted. Of two fences of one stream only the later one is kept: a wait
  // for an event covers all the work queued on its stream before it (stream order).
  for (auto& held : block.fences) {
    if (held.fence.stream != fence.stream) continue;
    if (held.order >= order) {
      drop_event(fence.event);
    } else {
      drop_event(held.fence.event);
      held = {fence, order};
    }
    return;
  }
  block.fences.push_back({fence, order});
}

void CachingPool::drop_event(void* event) {
  auto found = event_copies_.find(event);
  if (found == event_copies_.end()) return;
  if (--found->second == 0) {
    event_copies_.erase(found);
    unused_events_.push_back(event);
  }
}

void CachingPool::release_fences(const std::vector<Fence>& fences) {
  std::lock_guard lock(mutex_);
  std::unordered_map<void*, std::int64_t> copies;
  for (const auto& fence : fences) ++copies[fence.event];
  for (const auto& [event, count] : copies) {
    auto found = event_copies_.find(event);
    if (found == event_copies_.end() || found->second < count)
      throw std::invalid_argument("memory pool: release_fences of a fence it has not handed out");
  }
  for (const auto& fence : fences) drop_event(fence.event);
}

std::vector<void*> CachingPool::take_unused_events() {
  std::lock_guard lock(mutex_);
  return std::exchange(unused_events_, {});
}

std::int64_t CachingPool::release_cached() {
  std::lock_guard lock(mutex_);
  return release_free_segments();
}

void CachingPool::set_limit(std::int64_t limit_bytes) {
  if (limit_bytes < 0)
    throw std::invalid_argument(
        fmt::format("memory pool: limit must be >= 0, got {}", limit_bytes));
  std::lock_guard lock(mutex_);
  stats_.limit_bytes = limit_bytes;
}

std::int64_t CachingPool::limit() const {
  std::lock_guard lock(mutex_);
  return stats_.limit_bytes;
}

PoolStats CachingPool::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void CachingPool::reset_peaks() {
  std::lock_guard lock(mutex_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

}  // namespace shardplan::kernels
