#include "executor/tracked_allocator.hpp"
#include "kernels/memory_source.hpp"

#include <algorithm>
#include <string>

#include <fmt/format.h>

namespace shardplan::executor {

using kernels::MemorySource;
namespace {

std::string describe_bytes(std::int64_t bytes) {
  return fmt::format("{:.2f} GiB ({} bytes)", static_cast<double>(bytes) / (1024.0 * 1024 * 1024),
                     bytes);
}

}  // namespace

const char* category_name(MemoryCategory category) {
  switch (category) {
  case MemoryCategory::parameters:
    return "parameters";
  case MemoryCategory::gradients:
    return "gradients";
  case MemoryCategory::optimizer_states:
    return "optimizer_states";
  case MemoryCategory::activations:
    return "activations";
  case MemoryCategory::buffers:
    return "buffers";
  case MemoryCategory::overhead:
    return "overhead";
  }
  return "?";
}

std::int64_t MemoryBreakdown::total() const {
  std::int64_t sum = 0;
  for (auto b : bytes) sum += b;
  return sum;
}

OutOfMemory::OutOfMemory(MemoryCategory category, std::int64_t requested_bytes,
                         std::int64_t in_use_bytes, std::int64_t capacity_bytes)
    : std::runtime_error(fmt::format(
          "out of memory: allocating {} of {} with {} in use would exceed the capacity of {}",
          describe_bytes(requested_bytes), category_name(category), describe_bytes(in_use_bytes),
          describe_bytes(capacity_bytes))),
      category_(category), requested_(requested_bytes), in_use_(in_use_bytes),
      capacity_(capacity_bytes) {}

TrackedAllocator::TrackedAllocator(std::int64_t capacity_bytes, MemorySource* source)
    : source_(source ? source : &heap_), capacity_(capacity_bytes) {
  if (capacity_bytes < 0)
    throw std::invalid_argument(
        fmt::format("allocator capacity must be >= 0, got {}", capacity_bytes));
}

void TrackedAllocator::throw_bad_count(std::int64_t count, std::size_t element_size) {
  throw std::invalid_argument(
      fmt::format("cannot allocate {} elements of {} bytes", count, element_size));
}

void* TrackedAllocator::acquire(MemoryCategory category, std::int64_t bytes, bool zero) {
  {
    std::lock_guard lock(mutex_);
    const std::int64_t total = in_use_.total();
    if (bytes > capacity_ - total) throw OutOfMemory(category, bytes, total, capacity_);
    // Counted before the real allocation so that two threads cannot both pass the check; undone
    // below if the system itself refuses.
    in_use_[category] += bytes;
    ++allocations_;
    category_peaks_[category] = std::max(category_peaks_[category], in_use_[category]);
    if (total + bytes > peak_total_) {
      peak_total_ = total + bytes;
      at_peak_ = in_use_;
    }
  }
  void* p = nullptr;
  try {
    p = source_->allocate(bytes, zero);
  } catch (...) {
    std::lock_guard lock(mutex_);
    in_use_[category] -= bytes;
    throw;
  }
  return p;
}

void TrackedAllocator::release(void* data, MemoryCategory category, std::int64_t bytes) noexcept {
  source_->free(data, bytes);
  std::lock_guard lock(mutex_);
  in_use_[category] -= bytes;
}

std::int64_t TrackedAllocator::capacity_bytes() const {
  std::lock_guard lock(mutex_);
  return capacity_;
}

void TrackedAllocator::set_capacity(std::int64_t capacity_bytes) {
  if (capacity_bytes < 0)
    throw std::invalid_argument(
        fmt::format("allocator capacity must be >= 0, got {}", capacity_bytes));
  std::lock_guard lock(mutex_);
  capacity_ = capacity_bytes;
}

std::int64_t TrackedAllocator::in_use_bytes() const {
  std::lock_guard lock(mutex_);
  return in_use_.total();
}

std::int64_t TrackedAllocator::in_use_bytes(MemoryCategory category) const {
  std::lock_guard lock(mutex_);
  return in_use_[category];
}

MemoryBreakdown TrackedAllocator::in_use() const {
  std::lock_guard lock(mutex_);
  return in_use_;
}

std::int64_t TrackedAllocator::peak_bytes() const {
  std::lock_guard lock(mutex_);
  return peak_total_;
}

std::int64_t TrackedAllocator::peak_bytes(MemoryCategory category) const {
  std::lock_guard lock(mutex_);
  return category_peaks_[category];
}

MemoryBreakdown TrackedAllocator::breakdown_at_peak() const {
  std::lock_guard lock(mutex_);
  return at_peak_;
}

std::int64_t TrackedAllocator::allocation_count() const {
  std::lock_guard lock(mutex_);
  return allocations_;
}

void TrackedAllocator::reset_peaks() {
  std::lock_guard lock(mutex_);
  category_peaks_ = in_use_;
  at_peak_ = in_use_;
  peak_total_ = in_use_.total();
}

}  // namespace shardplan::executor
