// The tracked allocator: every tensor and buffer of the executor is allocated through it with a
// category, the same breakdown the cost model predicts (parameters, gradients, optimizer states,
// activations, buffers, overhead). It records the bytes in use and the peak of each category, the
// peak of the total and the breakdown at that moment, and it can be given a capacity ("this device
// has 2 GiB"): an allocation that would cross it throws OutOfMemory instead.
//
// Bytes are counted exactly as requested (count × sizeof(T)): there is no rounding and no
// fragmentation, so a prediction for this allocator needs no fragmentation reserve. Memory that is
// not allocated here is not counted: Eigen's GEMM packing workspace (a few hundred KiB, bounded by
// its cache blocking) and the C++ runtime's own heap.
//
// The bytes themselves come from a MemorySource (memory_source.hpp): the heap by default, the GPU's
// caching pool for the CUDA backend, whose rounding and reserved segments it reports itself.
//
// There is no global state: an allocator is an object, passed by reference to whatever allocates.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <mutex>
#include <span>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "kernels/memory_source.hpp"

namespace shardplan::executor {

// The cost model's memory breakdown; every allocation names one.
enum class MemoryCategory {
  parameters,
  gradients,
  optimizer_states,
  activations,
  buffers,
  overhead
};
inline constexpr std::size_t kMemoryCategoryCount = 6;
inline constexpr std::array<MemoryCategory, kMemoryCategoryCount> kMemoryCategories = {
    MemoryCategory::parameters,  MemoryCategory::gradients, MemoryCategory::optimizer_states,
    MemoryCategory::activations, MemoryCategory::buffers,   MemoryCategory::overhead};

// "parameters", "gradients", "optimizer_states", "activations", "buffers", "overhead".
const char* category_name(MemoryCategory category);

// Bytes per category at one moment.
struct MemoryBreakdown {
  std::array<std::int64_t, kMemoryCategoryCount> bytes{};
  std::int64_t& operator[](MemoryCategory c) { return bytes[static_cast<std::size_t>(c)]; }
  std::int64_t operator[](MemoryCategory c) const { return bytes[static_cast<std::size_t>(c)]; }
  std::int64_t total() const;
};

// An allocation that would cross the capacity. what() is one line, e.g.
// "out of memory: allocating 1.50 GiB (1610612736 bytes) of activations with 1.80 GiB
//  (1932735283 bytes) in use would exceed the capacity of 2.00 GiB (2147483648 bytes)".
class OutOfMemory : public std::runtime_error {
public:
  OutOfMemory(MemoryCategory category, std::int64_t requested_bytes, std::int64_t in_use_bytes,
              std::int64_t capacity_bytes);
  MemoryCategory category() const { return category_; }
  std::int64_t requested_bytes() const { return requested_; }
  std::int64_t in_use_bytes() const { return in_use_; }
  std::int64_t capacity_bytes() const { return capacity_; }

private:
  MemoryCategory category_;
  std::int64_t requested_;
  std::int64_t in_use_;
  std::int64_t capacity_;
};

class TrackedAllocator;

// Owns `size()` elements of T allocated through a TrackedAllocator, and gives them back when it is
// destroyed or reset. Move-only. The allocator must outlive every buffer it handed out.
template <class T> class TrackedBuffer {
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>,
                "tracked buffers hold plain numbers");

public:
  TrackedBuffer() = default;
  TrackedBuffer(const TrackedBuffer&) = delete;
  TrackedBuffer& operator=(const TrackedBuffer&) = delete;
  TrackedBuffer(TrackedBuffer&& other) noexcept { swap(other); }
  TrackedBuffer& operator=(TrackedBuffer&& other) noexcept {
    if (this != &other) {
      reset();
      swap(other);
    }
    return *this;
  }
  ~TrackedBuffer() { reset(); }

  // Frees the storage now (the buffer becomes empty).
  void reset() noexcept;

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::int64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  std::int64_t bytes() const { return size_ * static_cast<std::int64_t>(sizeof(T)); }
  MemoryCategory category() const { return category_; }
  std::span<T> span() { return {data_, static_cast<std::size_t>(size_)}; }
  std::span<const T> span() const { return {data_, static_cast<std::size_t>(size_)}; }
  T& operator[](std::int64_t i) { return data_[i]; }
  const T& operator[](std::int64_t i) const { return data_[i]; }

private:
  friend class TrackedAllocator;
  TrackedBuffer(TrackedAllocator* allocator, T* data, std::int64_t size, MemoryCategory category)
      : allocator_(allocator), data_(data), size_(size), category_(category) {}
  void swap(TrackedBuffer& other) noexcept {
    std::swap(allocator_, other.allocator_);
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    std::swap(category_, other.category_);
  }

  TrackedAllocator* allocator_ = nullptr;
  T* data_ = nullptr;
  std::int64_t size_ = 0;
  MemoryCategory category_ = MemoryCategory::overhead;
};

// The executor's buffers are fp32.
using Buffer = TrackedBuffer<float>;

class TrackedAllocator {
public:
  static constexpr std::int64_t kUnlimited = std::numeric_limits<std::int64_t>::max();

  // capacity_bytes: the most bytes that may be in use at once (kUnlimited: no limit). source: where
  // the bytes come from (not owned; nullptr: the heap).
  explicit TrackedAllocator(std::int64_t capacity_bytes = kUnlimited,
                            kernels::MemorySource* source = nullptr);
  TrackedAllocator(const TrackedAllocator&) = delete;
  TrackedAllocator& operator=(const TrackedAllocator&) = delete;

  // `count` zero-initialised elements of T (zeroing touches every page, so the memory is really
  // resident). Throws OutOfMemory when the capacity would be crossed, std::invalid_argument for a
  // negative or overflowing count. A count of 0 gives an empty buffer and counts nothing.
  template <class T> TrackedBuffer<T> allocate(MemoryCategory category, std::int64_t count) {
    if (count < 0 || count > kUnlimited / static_cast<std::int64_t>(sizeof(T)))
      throw_bad_count(count, sizeof(T));
    if (count == 0) return {};
    void* p = acquire(category, count * static_cast<std::int64_t>(sizeof(T)));
    return TrackedBuffer<T>(this, static_cast<T*>(p), count, category);
  }

  // As allocate, without zeroing: for a buffer whose user writes every element before reading
  // any (a GEMM's output, a log-softmax's). Counted and checked against the capacity the same way;
  // its pages become resident as they are written.
  template <class T>
  TrackedBuffer<T> allocate_uninitialized(MemoryCategory category, std::int64_t count) {
    if (count < 0 || count > kUnlimited / static_cast<std::int64_t>(sizeof(T)))
      throw_bad_count(count, sizeof(T));
    if (count == 0) return {};
    void* p = acquire(category, count * static_cast<std::int64_t>(sizeof(T)), false);
    return TrackedBuffer<T>(this, static_cast<T*>(p), count, category);
  }

  std::int64_t capacity_bytes() const;
  kernels::MemorySource& source() const { return *source_; }
  // Whether the host may touch the buffers' elements (false on a GPU).
  bool host_accessible() const { return source_->host_accessible(); }
  // From now on at most this many bytes may be in use (a fault injection takes the free capacity
  // away, so that the next allocation throws OutOfMemory). Buffers already handed out are kept.
  void set_capacity(std::int64_t capacity_bytes);
  std::int64_t in_use_bytes() const;                         // total, now
  std::int64_t in_use_bytes(MemoryCategory category) const;  // one category, now
  MemoryBreakdown in_use() const;                            // every category, now
  std::int64_t peak_bytes() const;                           // highest total seen
  std::int64_t peak_bytes(MemoryCategory category) const;    // the category's own highest
  MemoryBreakdown breakdown_at_peak() const;  // every category when the total peaked (first time)
  std::int64_t allocation_count() const;      // allocations made so far (not frees)

  // Starts the peaks again from what is in use now (e.g. to measure one step alone).
  void reset_peaks();

private:
  template <class T> friend class TrackedBuffer;
  void* acquire(MemoryCategory category, std::int64_t bytes, bool zero = true);
  void release(void* data, MemoryCategory category, std::int64_t bytes) noexcept;
  [[noreturn]] static void throw_bad_count(std::int64_t count, std::size_t element_size);

  kernels::HostMemory heap_;
  kernels::MemorySource* source_;
  mutable std::mutex mutex_;  // buffers may be freed from a communication thread
  std::int64_t capacity_;
  MemoryBreakdown in_use_;
  MemoryBreakdown category_peaks_;
  MemoryBreakdown at_peak_;
  std::int64_t peak_total_ = 0;
  std::int64_t allocations_ = 0;
};

template <class T> void TrackedBuffer<T>::reset() noexcept {
  if (allocator_ && data_) allocator_->release(data_, category_, bytes());
  allocator_ = nullptr;
  data_ = nullptr;
  size_ = 0;
}

}  // namespace shardplan::executor
