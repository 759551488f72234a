#include "kernels/memory_source.hpp"

#include <cstring>
#include <new>

namespace shardplan::kernels {
namespace {

constexpr std::align_val_t kAlignment{64};  // HostMemory's (memory_source.hpp)

}  // namespace

void* HostMemory::allocate(std::int64_t bytes, bool zero) {
  void* p = ::operator new(static_cast<std::size_t>(bytes), kAlignment);
  if (zero) std::memset(p, 0, static_cast<std::size_t>(bytes));
  return p;
}

void HostMemory::free(void* data, std::int64_t) noexcept { ::operator delete(data, kAlignment); }

void HostMemory::write(void* dst, const void* host, std::int64_t bytes) {
  if (bytes > 0) std::memcpy(dst, host, static_cast<std::size_t>(bytes));
}

void HostMemory::read(void* host, const void* src, std::int64_t bytes) {
  if (bytes > 0) std::memcpy(host, src, static_cast<std::size_t>(bytes));
}

void HostMemory::copy(void* dst, const void* src, std::int64_t bytes) {
  if (bytes > 0 && dst != src) std::memmove(dst, src, static_cast<std::size_t>(bytes));
}

}  // namespace shardplan::kernels
