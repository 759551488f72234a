#include "kernels/host_stream_memory.hpp"

#include <algorithm>

namespace shardplan::kernels {

StreamOrderedHostMemory::~StreamOrderedHostMemory() {
  for (auto& h : held_) {
    for (const auto& f : h.fences) {
      try {
        f.stream->wait_for(f.ticket);
      } catch (...) {
        // A failed stream runs nothing more: its memory is free to go.
      }
    }
    heap_.free(h.data, h.bytes);
  }
}

void StreamOrderedHostMemory::set_stream(comm::HostStream* stream) {
  std::lock_guard lock(mutex_);
  stream_ = stream;
}

void StreamOrderedHostMemory::record_use(const void* p, comm::HostStream* stream) {
  if (stream == nullptr) return;
  std::lock_guard lock(mutex_);
  const auto it = users_.find(p);
  if (it == users_.end())
    return;  // not a block of this memory (a view inside one is recorded by its block's owner)
  if (std::find(it->second.begin(), it->second.end(), stream) == it->second.end())
    it->second.push_back(stream);
}

void StreamOrderedHostMemory::release_done() {
  std::erase_if(held_, [&](Held& h) {
    for (const auto& f : h.fences)
      if (f.stream->done() < f.ticket) return false;
    heap_.free(h.data, h.bytes);
    return true;
  });
}

void* StreamOrderedHostMemory::allocate(std::int64_t bytes, bool zero) {
  std::lock_guard lock(mutex_);
  release_done();
  void* p = heap_.allocate(bytes, zero);
  auto& users = users_[p];
  users.clear();
  if (stream_ != nullptr) users.push_back(stream_);
  return p;
}

void StreamOrderedHostMemory::free(void* data, std::int64_t bytes) noexcept {
  std::lock_guard lock(mutex_);
  std::vector<Fence> fences;
  if (const auto it = users_.find(data); it != users_.end()) {
    for (auto* s : it->second)
      if (const auto ticket = s->queued(); s->done() < ticket) fences.push_back({s, ticket});
    users_.erase(it);
  }
  if (fences.empty())
    heap_.free(data, bytes);
  else
    held_.push_back({data, bytes, std::move(fences)});
  release_done();
}

void StreamOrderedHostMemory::write(void* dst, const void* host, std::int64_t bytes) {
  heap_.write(dst, host, bytes);
}
void StreamOrderedHostMemory::read(void* host, const void* src, std::int64_t bytes) {
  heap_.read(host, src, bytes);
}
void StreamOrderedHostMemory::copy(void* dst, const void* src, std::int64_t bytes) {
  heap_.copy(dst, src, bytes);
}

std::size_t StreamOrderedHostMemory::held_back() const {
  std::lock_guard lock(mutex_);
  return held_.size();
}

}  // namespace shardplan::kernels
