#include "comm/host_buffer.hpp"

#include <cstring>
#include <new>
#include <stdexcept>

namespace shardplan::comm {
namespace {
constexpr std::align_val_t kAlignment{64};  // a cache line
}  // namespace

void HostBuffer::AlignedDelete::operator()(std::byte* p) const {
  ::operator delete[](p, kAlignment);
}

HostBuffer::HostBuffer(std::size_t bytes)
    : bytes_(bytes),
      storage_(static_cast<std::byte*>(::operator new[](bytes == 0 ? 1 : bytes, kAlignment))) {}

void HostBuffer::do_copy_from_host(const void* source, std::size_t bytes, std::size_t offset) {
  if (offset > bytes_ || bytes > bytes_ - offset)
    throw std::out_of_range("HostBuffer::copy_from_host: beyond the end of the buffer");
  if (bytes > 0) std::memcpy(storage_.get() + offset, source, bytes);
}

void HostBuffer::do_copy_to_host(void* destination, std::size_t bytes, std::size_t offset) const {
  if (offset > bytes_ || bytes > bytes_ - offset)
    throw std::out_of_range("HostBuffer::copy_to_host: beyond the end of the buffer");
  if (bytes > 0) std::memcpy(destination, storage_.get() + offset, bytes);
}

}  // namespace shardplan::comm
