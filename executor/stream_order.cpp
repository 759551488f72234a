#include "executor/stream_order.hpp"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

namespace shardplan::executor {

int StreamOrderChecker::index_of(Stream s) {
  if (const auto it = index_.find(s); it != index_.end()) return it->second;
  const int i = static_cast<int>(streams_.size());
  streams_.push_back(s);
  names_.emplace_back(s == kHost ? "host" : "");
  clocks_.emplace_back();
  index_.emplace(s, i);
  return i;
}

StreamOrderChecker::Clock& StreamOrderChecker::clock(int i) {
  auto& c = clocks_[static_cast<std::size_t>(i)];
  if (c.size() < streams_.size()) c.resize(streams_.size(), 0);
  return c;
}

namespace {
void join(std::vector<std::uint64_t>& into, const std::vector<std::uint64_t>& from) {
  if (into.size() < from.size()) into.resize(from.size(), 0);
  for (std::size_t t = 0; t < from.size(); ++t) into[t] = std::max(into[t], from[t]);
}
}  // namespace

void StreamOrderChecker::name_stream(Stream s, std::string name) {
  names_[static_cast<std::size_t>(index_of(s))] = std::move(name);
}

std::string StreamOrderChecker::stream_name(int i) const {
  const auto& n = names_[static_cast<std::size_t>(i)];
  return n.empty() ? fmt::format("stream {}", i) : n;
}

std::uint64_t StreamOrderChecker::tick(int s) {
  const int host = index_of(kHost);
  if (s != host) join(clock(s), clock(host));
  return ++clock(s)[static_cast<std::size_t>(s)];
}

void StreamOrderChecker::wait(Stream waiter, Stream producer) {
  const int w = index_of(waiter), p = index_of(producer);
  if (w == p) return;
  tick(p);  // the event is recorded by the host: it follows what the host waited for
  join(clock(w), clock(p));
}

void StreamOrderChecker::host_waits(Stream s) {
  const int i = index_of(s);
  const int host = index_of(kHost);
  join(clock(host), clock(i));
}

bool StreamOrderChecker::ordered(const Access& earlier, const Clock& later) const {
  const auto t = static_cast<std::size_t>(earlier.stream);
  return t < later.size() && later[t] >= earlier.epoch;
}

StreamOrderChecker::Block* StreamOrderChecker::block_of(const void* p, const char** base) {
  const auto* c = static_cast<const char*>(p);
  auto it = blocks_.upper_bound(c);
  if (it == blocks_.begin()) return nullptr;
  --it;
  if (c >= it->first + it->second.bytes) return nullptr;
  *base = it->first;
  return &it->second;
}

void StreamOrderChecker::report(std::string line) {
  ++finding_count_;
  if (findings_.size() < kMaxFindings) findings_.push_back(std::move(line));
}

void StreamOrderChecker::allocated(const void* p, std::int64_t bytes, Stream s, std::string label) {
  if (bytes <= 0) return;
  const auto* c = static_cast<const char*>(p);
  // Memory handed out again: a freed block there is gone (its users were fenced at the free).
  for (auto it = blocks_.lower_bound(c); it != blocks_.end() && it->first < c + bytes;)
    it = blocks_.erase(it);
  if (auto it = blocks_.lower_bound(c); it != blocks_.begin()) {
    --it;
    if (it->first + it->second.bytes > c) blocks_.erase(it);
  }
  const int i = index_of(s);
  Block b{bytes, std::move(label), i, {i}, {}, false};
  // The allocation is an operation of its stream that writes the whole block (the allocator's
  // wait for the previous users, and the zeroing where there is one).
  b.history.push_back({i, tick(i), 0, bytes, true, "allocation"});
  blocks_.emplace(c, std::move(b));
}

void StreamOrderChecker::record_use(const void* p, Stream s) {
  const char* base = nullptr;
  Block* b = block_of(p, &base);
  if (b == nullptr) return;
  const int i = index_of(s);
  if (std::find(b->users.begin(), b->users.end(), i) == b->users.end()) b->users.push_back(i);
}

void StreamOrderChecker::freed(const void* p) {
  const char* base = nullptr;
  Block* b = block_of(p, &base);
  if (b == nullptr || b->freed) return;
  // One event per user stream at the free: the memory is safe for its next owner once all are
  // done.
  Clock fences;
  for (int u : b->users) {
    tick(u);
    join(fences, clock(u));
  }
  for (const auto& a : b->history)
    if (!ordered(a, fences))
      report(fmt::format("{} freed while {} may still use it: {} of bytes [{}, {}) is not before "
                         "the free's events on {} (record_use is missing)",
                         b->label, stream_name(a.stream), a.what, a.begin, a.end, [&] {
                           std::string s;
                           for (int u : b->users) s += (s.empty() ? "" : ", ") + stream_name(u);
                           return s;
                         }()));
  b->freed = true;
  b->history.clear();
}

void StreamOrderChecker::read(Stream s, const void* p, std::int64_t bytes, const char* what) {
  access(s, p, bytes, false, what);
}
void StreamOrderChecker::write(Stream s, const void* p, std::int64_t bytes, const char* what) {
  access(s, p, bytes, true, what);
}

void StreamOrderChecker::access(Stream s, const void* p, std::int64_t bytes, bool write,
                                const char* what) {
  if (p == nullptr || bytes == 0) return;
  const char* base = nullptr;
  Block* b = block_of(p, &base);
  if (b == nullptr) return;
  ++accesses_;
  const int i = index_of(s);
  const std::int64_t begin = static_cast<const char*>(p) - base;
  const std::int64_t end = bytes < 0 ? b->bytes : begin + bytes;
  if (b->freed) {
    report(fmt::format("{} on {} uses {} after it was freed", what, stream_name(i), b->label));
    return;
  }
  if (end > b->bytes)
    report(fmt::format("{} on {} reaches byte {} of {}, which has {}", what, stream_name(i), end,
                       b->label, b->bytes));
  const std::uint64_t epoch = tick(i);
  const Clock& now = clock(i);
  for (const auto& a : b->history) {
    if (a.stream == i || !(a.write || write) || a.end <= begin || end <= a.begin) continue;
    if (!ordered(a, now))
      report(fmt::format("{} on {} ({} bytes [{}, {}) of {}) is not ordered after {} on {} "
                         "({} bytes [{}, {}))",
                         what, stream_name(i), write ? "writes" : "reads", begin, end, b->label,
                         a.what, stream_name(a.stream), a.write ? "writes" : "reads", a.begin,
                         a.end));
  }
  // An access covers the earlier ones of its own stream and kind within its range (stream order:
  // whatever must follow them must follow it); a write covers every access within its range
  // (checked above to be ordered before it, so what is ordered after it is ordered after them).
  std::erase_if(b->history, [&](const Access& a) {
    const bool inside = begin <= a.begin && a.end <= end;
    return inside && (write || (a.stream == i && !a.write));
  });
  b->history.push_back({i, epoch, begin, end, write, what});
}

}  // namespace shardplan::executor
