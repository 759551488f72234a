// The caching pool's rules, on host memory. Every expected number is derived by hand in a comment
// from the rules in kernels/caching_pool.hpp (PyTorch's CUDACachingAllocator.cpp): requests round
// up to 512 B; <= 1 MiB is small (2 MiB segments); < 10 MiB shares 20 MiB segments; larger gets
// its own segment rounded up to 2 MiB; split when the rest is >= 512 B (small) or > 1 MiB (large).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/caching_pool.hpp"

using namespace shardplan::kernels;

namespace {

constexpr std::int64_t KiB = 1024;
constexpr std::int64_t MiB = std::int64_t{1024} * 1024;

// Streams and events are opaque to the pool: distinct addresses stand for distinct handles.
int handles[8];
void* const S1 = &handles[0];
void* const S2 = &handles[1];
void* const S3 = &handles[2];
void* const E1 = &handles[4];
void* const E2 = &handles[5];
void* const E3 = &handles[6];

char* at(void* p) { return static_cast<char*>(p); }

std::vector<void*> events_of(const std::vector<Fence>& fences) {
  std::vector<void*> events;
  events.reserve(fences.size());
  for (const auto& f : fences) events.push_back(f.event);
  std::sort(events.begin(), events.end());
  return events;
}

std::vector<void*> sorted(std::vector<void*> v) {
  std::sort(v.begin(), v.end());
  return v;
}

}  // namespace

TEST_CASE("kernels::pool rounds requests up to a multiple of 512 bytes") {
  CHECK(CachingPool::rounded_size(1) == 512);
  CHECK(CachingPool::rounded_size(512) == 512);
  CHECK(CachingPool::rounded_size(513) == 1024);
  CHECK(CachingPool::rounded_size(1000) == 1024);
  CHECK(CachingPool::rounded_size(MiB) == MiB);
  CHECK(CachingPool::rounded_size(MiB + 1) == MiB + 512);

  HostSegmentSource source;
  CachingPool pool(source);
  auto a = pool.allocate(1, S1);
  CHECK(a.bytes == 512);
  CHECK(pool.stats().allocated_bytes == 512);
  CHECK_THROWS_AS(pool.allocate(0, S1), std::invalid_argument);
  CHECK_THROWS_AS(pool.allocate(-5, S1), std::invalid_argument);
  CHECK_THROWS_AS(pool.allocate(CachingPool::kMaxRequestBytes + 1, S1), std::invalid_argument);
}

TEST_CASE("kernels::pool segment sizes of small and large requests") {
  CHECK(CachingPool::segment_size(512) == 2 * MiB);              // small
  CHECK(CachingPool::segment_size(MiB) == 2 * MiB);              // largest small
  CHECK(CachingPool::segment_size(MiB + 512) == 20 * MiB);       // smallest large
  CHECK(CachingPool::segment_size(10 * MiB - 512) == 20 * MiB);  // below 10 MiB: shared
  CHECK(CachingPool::segment_size(10 * MiB) == 10 * MiB);        // own, already a multiple of 2 MiB
  CHECK(CachingPool::segment_size(11 * MiB) == 12 * MiB);        // own, rounded up to 2 MiB
  CHECK(CachingPool::segment_size(21 * MiB + 512) == 22 * MiB);

  HostSegmentSource source;
  CachingPool pool(source);
  // 1000 B -> 1024 B, small: a 2 MiB segment.
  auto a = pool.allocate(1000, S1);
  CHECK(pool.stats().reserved_bytes == 2 * MiB);
  CHECK(pool.stats().segments == 1);
  CHECK(pool.stats().maps == 1);
  CHECK(pool.stats().allocated_bytes == 1024);
  // 3 MiB, large and < 10 MiB: a 20 MiB segment (22 MiB reserved); the 17 MiB rest is split off.
  auto b = pool.allocate(3 * MiB, S1);
  CHECK(pool.stats().reserved_bytes == 22 * MiB);
  CHECK(pool.stats().segments == 2);
  CHECK(pool.stats().allocated_bytes == 1024 + 3 * MiB);
  // 12 MiB + 1 -> 12 MiB + 512 fits the 17 MiB rest: no new segment, placed right after b.
  auto c = pool.allocate(12 * MiB + 1, S1);
  CHECK(at(c.ptr) == at(b.ptr) + 3 * MiB);
  CHECK(c.bytes == 12 * MiB + 512);
  CHECK(pool.stats().maps == 2);
  // 30 MiB does not fit the 5 MiB - 512 rest: its own segment of 30 MiB (52 MiB reserved).
  auto d = pool.allocate(30 * MiB, S1);
  CHECK(pool.stats().reserved_bytes == 52 * MiB);
  CHECK(pool.stats().maps == 3);
  // 1 MiB is small: it fits the small segment's 2 MiB - 1024 rest, right after a.
  auto e = pool.allocate(MiB, S1);
  CHECK(at(e.ptr) == at(a.ptr) + 1024);
  CHECK(pool.stats().maps == 3);
  // Another 1 MiB: the small segment has 1 MiB - 1024 left, and the large pool's free
  // 5 MiB - 512 is not for small requests: a second 2 MiB segment (54 MiB reserved).
  auto f = pool.allocate(MiB, S1);
  CHECK(pool.stats().maps == 4);
  CHECK(pool.stats().segments == 4);
  CHECK(pool.stats().reserved_bytes == 54 * MiB);
  // 1024 + 3 MiB + (12 MiB + 512) + 30 MiB + 1 MiB + 1 MiB
  CHECK(pool.stats().allocated_bytes == 1024 + 47 * MiB + 512);
}

TEST_CASE("kernels::pool splits blocks and reuses freed ones") {
  HostSegmentSource source;
  CachingPool pool(source);
  SUBCASE("small pool: a rest of 512 B or more is split off") {
    auto a = pool.allocate(1000, S1);  // [0, 1024) of a 2 MiB segment
    auto b = pool.allocate(1000, S1);  // [1024, 2048): the rest was split off after a
    CHECK(at(b.ptr) == at(a.ptr) + 1024);
    pool.free(a.ptr, {});
    // 600 -> 1024: free blocks are a's 1024 B and the 2 MiB - 2048 rest; the smaller is a's.
    auto c = pool.allocate(600, S2);
    CHECK(c.ptr == a.ptr);
    CHECK(c.bytes == 1024);
    CHECK(pool.stats().maps == 1);
    // 1 MiB (small) goes to the rest [2048, 2 MiB) and splits it; 1 MiB - 2048 then fits
    // exactly what is left: no new segment.
    auto d = pool.allocate(MiB, S1);
    CHECK(at(d.ptr) == at(a.ptr) + 2048);
    auto e = pool.allocate(MiB - 2048, S1);
    CHECK(at(e.ptr) == at(a.ptr) + 2048 + MiB);
    CHECK(e.bytes == MiB - 2048);
    CHECK(pool.stats().maps == 1);
    CHECK(pool.stats().allocated_bytes == 2 * MiB);  // 1024 + 1024 + 1 MiB + (1 MiB - 2048)
  }
  SUBCASE("small pool: a rest of exactly 512 B is split off") {
    auto a = pool.allocate(1536, S1);  // [0, 1536)
    auto b = pool.allocate(512, S1);   // [1536, 2048) keeps a apart from the segment's rest
    pool.free(a.ptr, {});
    // 1024 in the free 1536 B (smaller than the rest): 512 B are left, enough to split.
    auto c = pool.allocate(1024, S1);
    CHECK(c.ptr == a.ptr);
    CHECK(c.bytes == 1024);
    auto d = pool.allocate(512, S1);  // exactly the 512 B split off
    CHECK(at(d.ptr) == at(a.ptr) + 1024);
    (void)b;
  }
  SUBCASE("large pool: a rest of 1 MiB is kept with the block, more than 1 MiB is split off") {
    // 19 MiB -> own segment of 20 MiB (>= 10 MiB: rounded up to 2 MiB); rest 1 MiB: not split.
    auto a = pool.allocate(19 * MiB, S1);
    CHECK(a.bytes == 20 * MiB);
    CHECK(pool.stats().allocated_bytes == 20 * MiB);
    // 19 MiB - 512 -> another 20 MiB segment; rest 1 MiB + 512 > 1 MiB: split.
    auto b = pool.allocate(19 * MiB - 512, S1);
    CHECK(b.bytes == 19 * MiB - 512);
    CHECK(pool.stats().maps == 2);
    // 1 MiB + 1 -> 1 MiB + 512 (large): exactly the rest after b.
    auto c = pool.allocate(MiB + 1, S1);
    CHECK(at(c.ptr) == at(b.ptr) + 19 * MiB - 512);
    CHECK(pool.stats().maps == 2);
    CHECK(pool.stats().allocated_bytes == 40 * MiB);
    // A freed segment-sized block serves the next request of its size without a new segment.
    pool.free(a.ptr, {});
    auto d = pool.allocate(19 * MiB + 512, S2);
    CHECK(d.ptr == a.ptr);
    CHECK(pool.stats().maps == 2);
  }
}

TEST_CASE("kernels::pool merges a freed block with its free neighbours") {
  HostSegmentSource source;
  CachingPool pool(source);
  auto a = pool.allocate(1000, S1);  // [0, 1024)
  auto b = pool.allocate(1000, S1);  // [1024, 2048)
  auto c = pool.allocate(1000, S1);  // [2048, 3072); free rest [3072, 2 MiB)
  pool.free(a.ptr, {});
  pool.free(c.ptr, {});  // merges with the rest: [2048, 2 MiB)
  // 1500 -> 1536 does not fit a's 1024 B (b keeps them apart): it goes to [2048, ...).
  auto d = pool.allocate(1500, S1);
  CHECK(at(d.ptr) == at(a.ptr) + 2048);
  pool.free(d.ptr, {});
  CHECK(pool.release_cached() == 0);  // b is still handed out
  pool.free(b.ptr, {});               // merges with a below and the rest above: one 2 MiB block
  // A whole free segment is the only kind release_cached gives back.
  CHECK(pool.release_cached() == 2 * MiB);
  CHECK(pool.stats().reserved_bytes == 0);
  CHECK(pool.stats().segments == 0);
  CHECK(pool.stats().unmaps == 1);
  CHECK(source.mapped_bytes() == 0);
}

TEST_CASE("kernels::pool best fit: the smallest free block that fits, then the lowest address") {
  HostSegmentSource source;
  CachingPool pool(source);
  // One 20 MiB segment (every request below is large and < 10 MiB), carved in MiB:
  // x1 [0,3) s1 [3,5) x2 [5,8) s2 [8,10) x3 [10,14) s3 [14,16) rest [16,20).
  auto x1 = pool.allocate(3 * MiB, S1);
  auto s1 = pool.allocate(2 * MiB, S1);
  auto x2 = pool.allocate(3 * MiB, S1);
  auto s2 = pool.allocate(2 * MiB, S1);
  auto x3 = pool.allocate(4 * MiB, S1);
  auto s3 = pool.allocate(2 * MiB, S1);
  char* base = at(x1.ptr);
  CHECK(at(s3.ptr) == base + 14 * MiB);
  CHECK(pool.stats().maps == 1);
  pool.free(x3.ptr, {});
  pool.free(x2.ptr, {});
  pool.free(x1.ptr, {});
  // Free: 3 MiB at 0, 3 MiB at 5, 4 MiB at 10, 4 MiB at 16 (the s blocks keep them apart).
  // 3 MiB - 100 -> 3 MiB: two equal fits, the lower address wins.
  auto r1 = pool.allocate(3 * MiB - 100, S1);
  CHECK(at(r1.ptr) == base);
  // 2 MiB + 1 -> 2 MiB + 512: the smallest fit is the 3 MiB at 5; the rest (1 MiB - 512) is not
  // more than 1 MiB, so the whole 3 MiB block is handed out.
  auto r2 = pool.allocate(2 * MiB + 1, S1);
  CHECK(at(r2.ptr) == base + 5 * MiB);
  CHECK(r2.bytes == 3 * MiB);
  // 4 MiB: two equal fits at 10 and 16: 10.
  auto r3 = pool.allocate(4 * MiB, S1);
  CHECK(at(r3.ptr) == base + 10 * MiB);
  // 2 MiB: only the 4 MiB at 16 is left; its 2 MiB rest is split off.
  auto r4 = pool.allocate(2 * MiB, S1);
  CHECK(at(r4.ptr) == base + 16 * MiB);
  CHECK(r4.bytes == 2 * MiB);
  CHECK(pool.stats().maps == 1);
  // Handed out: 3 (r1) + 2 + 3 (r2) + 2 + 4 (r3) + 2 + 2 (r4) = 18 MiB.
  CHECK(pool.stats().allocated_bytes == 18 * MiB);
  (void)s1;
  (void)s2;
}

TEST_CASE("kernels::pool limit: free segments are released and the request retried once") {
  HostSegmentSource source;
  CachingPool pool(source, 20 * MiB);
  auto a = pool.allocate(1000, S1);  // 2 MiB segment
  pool.free(a.ptr, {});
  // 3 MiB needs a 20 MiB segment: 2 + 20 > 20, so the free 2 MiB segment goes, then 0 + 20 fits.
  auto b = pool.allocate(3 * MiB, S1);
  CHECK(pool.stats().reserved_bytes == 20 * MiB);
  CHECK(pool.stats().segments == 1);
  CHECK(pool.stats().maps == 2);
  CHECK(pool.stats().unmaps == 1);
  CHECK(source.mapped_bytes() == 20 * MiB);
  // 1000 B needs a 2 MiB segment: 20 + 2 > 20 and nothing is free to release.
  bool thrown = false;
  try {
    pool.allocate(1000, S1);
  } catch (const PoolExhausted& e) {
    thrown = true;
    CHECK(e.requested_bytes() == 1000);
    CHECK(e.segment_bytes() == 2 * MiB);
    CHECK(e.reserved_bytes() == 20 * MiB);
    CHECK(e.limit_bytes() == 20 * MiB);
    CHECK(std::string(e.what()) ==
          "memory pool: a request of 1000 bytes (0.00 MiB) needs a new segment of 2097152 bytes "
          "(2.00 MiB), which with 20971520 bytes (20.00 MiB) reserved would exceed the limit of "
          "20971520 bytes (20.00 MiB)");
  }
  CHECK(thrown);
  CHECK(pool.stats().reserved_bytes == 20 * MiB);
  CHECK(pool.stats().allocated_bytes == 3 * MiB);
  std::memset(b.ptr, 7, static_cast<std::size_t>(3 * MiB));  // b is untouched and usable
  // A higher limit lets it through: 20 + 2 <= 22.
  pool.set_limit(22 * MiB);
  auto c = pool.allocate(1000, S1);
  CHECK(pool.stats().reserved_bytes == 22 * MiB);
  CHECK(pool.limit() == 22 * MiB);
  CHECK_THROWS_AS(pool.set_limit(-1), std::invalid_argument);
  // 2 GiB needs its own 2 GiB segment: 22 MiB + 2 GiB > 1 GiB, and nothing is free to release.
  pool.set_limit(1024 * MiB);
  CHECK_THROWS_WITH_AS(pool.allocate(2048 * MiB, S1),
                       "memory pool: a request of 2147483648 bytes (2.00 GiB) needs a new segment "
                       "of 2147483648 bytes (2.00 GiB), which with 23068672 bytes (22.00 MiB) "
                       "reserved would exceed the limit of 1073741824 bytes (1.00 GiB)",
                       PoolExhausted);
  CHECK(source.mapped_bytes() == 22 * MiB);
  (void)c;
}

TEST_CASE("kernels::pool a refusing source: free segments are released and the map retried") {
  HostSegmentSource source(21 * MiB);  // a "device" of 21 MiB
  CachingPool pool(source);
  auto a = pool.allocate(1000, S1);  // 2 MiB mapped
  pool.free(a.ptr, {});
  // The 20 MiB map is refused (2 + 20 > 21); the free 2 MiB segment is unmapped; the retry fits.
  auto b = pool.allocate(3 * MiB, S1);
  CHECK(source.mapped_bytes() == 20 * MiB);
  CHECK(pool.stats().maps == 2);
  CHECK(pool.stats().unmaps == 1);
  // Nothing to release now: the source's refusal goes through.
  CHECK_THROWS_AS(pool.allocate(1000, S1), std::bad_alloc);
  CHECK(pool.stats().reserved_bytes == 20 * MiB);
  (void)b;
}

TEST_CASE("kernels::pool hands the fences of freed blocks to the next user") {
  HostSegmentSource source;
  CachingPool pool(source);
  SUBCASE("a reused block returns its fence; the split rest keeps a copy") {
    auto a = pool.allocate(1000, S1);
    pool.free(a.ptr, {{S1, E1}});  // merges with the rest: the whole segment carries E1
    auto b = pool.allocate(1000, S2);
    CHECK(b.ptr == a.ptr);
    REQUIRE(b.fences.size() == 1);
    CHECK(b.fences[0].stream == S1);
    CHECK(b.fences[0].event == E1);
    pool.release_fences(b.fences);
    CHECK(pool.take_unused_events().empty());  // the rest [1024, 2 MiB) still holds E1
    pool.free(b.ptr, {{S2, E2}});              // whole segment again: E1 and E2
    CHECK(pool.release_cached() == 2 * MiB);
    CHECK(sorted(pool.take_unused_events()) == sorted({E1, E2}));
    CHECK(pool.take_unused_events().empty());  // each once
  }
  SUBCASE("the fences of merged blocks are all returned") {
    auto a = pool.allocate(1000, S1);  // [0, 1024)
    auto b = pool.allocate(1000, S1);  // [1024, 2048)
    auto c = pool.allocate(1000, S1);  // [2048, 3072): keeps a+b apart from the rest
    pool.free(a.ptr, {{S1, E1}});
    pool.free(b.ptr, {{S2, E2}});      // merges with a: [0, 2048) carries E1 and E2
    auto d = pool.allocate(2048, S3);  // exact fit (the rest is larger): no split
    CHECK(d.ptr == a.ptr);
    CHECK(events_of(d.fences) == sorted({E1, E2}));
    CHECK(pool.take_unused_events().empty());  // d's caller holds them until it has waited
    pool.release_fences(d.fences);
    CHECK(sorted(pool.take_unused_events()) == sorted({E1, E2}));
    CHECK_THROWS_AS(pool.release_fences(d.fences), std::invalid_argument);  // not counted now
    (void)c;
  }
  SUBCASE("of two fences of one stream only the later one is kept") {
    auto a = pool.allocate(1000, S1);
    auto b = pool.allocate(1000, S1);
    auto c = pool.allocate(1000, S1);
    pool.free(b.ptr, {{S1, E3}});
    pool.free(a.ptr, {{S1, E1}});  // freed later: E1 covers E3 on stream S1
    CHECK(pool.take_unused_events() == std::vector<void*>{E3});
    auto d = pool.allocate(2048, S2);
    REQUIRE(d.fences.size() == 1);
    CHECK(d.fences[0].event == E1);
    pool.release_fences(d.fences);
    CHECK(pool.take_unused_events() == std::vector<void*>{E1});
    (void)c;
  }
  SUBCASE("a free with a fence without an event is refused and changes nothing") {
    auto a = pool.allocate(1000, S1);
    CHECK_THROWS_AS(pool.free(a.ptr, {{S1, nullptr}}), std::invalid_argument);
    CHECK(pool.stats().allocated_bytes == 1024);
    pool.free(a.ptr, {});
    CHECK(pool.stats().allocated_bytes == 0);
  }
}

TEST_CASE("kernels::pool record_use adds the streams a free must fence") {
  HostSegmentSource source;
  CachingPool pool(source);
  auto a = pool.allocate(100, S1);
  CHECK(pool.streams_of(a.ptr) == std::vector<void*>{S1});
  pool.record_use(a.ptr, S2);
  pool.record_use(a.ptr, S2);  // once
  pool.record_use(a.ptr, S1);  // the allocating stream is already there
  CHECK(pool.streams_of(a.ptr) == std::vector<void*>{S1, S2});
  pool.free(a.ptr, {});
  CHECK_THROWS_AS(pool.streams_of(a.ptr), std::invalid_argument);
  CHECK_THROWS_AS(pool.record_use(a.ptr, S2), std::invalid_argument);
  CHECK_THROWS_AS(pool.free(a.ptr, {}), std::invalid_argument);  // twice
  int elsewhere = 0;
  CHECK_THROWS_AS(pool.free(&elsewhere, {}), std::invalid_argument);
  auto b = pool.allocate(100, S3);  // the same block, its recorded uses forgotten
  CHECK(b.ptr == a.ptr);
  CHECK(pool.streams_of(b.ptr) == std::vector<void*>{S3});
}

TEST_CASE("kernels::pool peaks of allocated and reserved bytes") {
  HostSegmentSource source;
  CachingPool pool(source);
  auto a = pool.allocate(1000, S1);     // allocated 1024, reserved 2 MiB
  auto b = pool.allocate(3 * MiB, S1);  // allocated 1024 + 3 MiB, reserved 22 MiB
  pool.free(b.ptr, {});                 // allocated 1024; the 20 MiB stay reserved (cached)
  auto s = pool.stats();
  CHECK(s.allocated_bytes == 1024);
  CHECK(s.peak_allocated_bytes == 1024 + 3 * MiB);
  CHECK(s.reserved_bytes == 22 * MiB);
  CHECK(pool.release_cached() == 20 * MiB);
  s = pool.stats();
  CHECK(s.reserved_bytes == 2 * MiB);
  CHECK(s.peak_reserved_bytes == 22 * MiB);
  pool.reset_peaks();
  s = pool.stats();
  CHECK(s.peak_allocated_bytes == 1024);
  CHECK(s.peak_reserved_bytes == 2 * MiB);
  CHECK(s.limit_bytes == CachingPool::kUnlimited);
  (void)a;
}

TEST_CASE("kernels::pool blocks are real, disjoint, 512-byte aligned host memory") {
  HostSegmentSource source;
  CachingPool pool(source);
  const std::vector<std::int64_t> sizes = {1, 700, 4 * KiB, MiB, MiB + 1, 3 * MiB, 12 * MiB};
  std::vector<CachingPool::Allocation> blocks;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    blocks.push_back(pool.allocate(sizes[i], S1));
    CHECK(reinterpret_cast<std::uintptr_t>(blocks.back().ptr) % 512 == 0);
    std::memset(blocks.back().ptr, static_cast<int>(i + 1), static_cast<std::size_t>(sizes[i]));
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const auto* p = static_cast<const unsigned char*>(blocks[i].ptr);
    const auto n = static_cast<std::size_t>(sizes[i]);
    CHECK(std::all_of(p, p + n, [i](unsigned char v) { return v == i + 1; }));
  }
}

TEST_CASE("kernels::pool allocations and frees from several threads") {
  HostSegmentSource source;
  CachingPool pool(source);
  constexpr int kThreads = 4;
  std::vector<int> wrong(kThreads, 0);
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&pool, &wrong, t] {
      std::uint64_t state = 12345u + static_cast<std::uint64_t>(t);
      auto next = [&state] {  // Knuth's MMIX linear congruential generator
        state = state * 6364136223846793005u + 1442695040888963407u;
        return state >> 33;
      };
      const auto mark = static_cast<unsigned char>(t + 1);
      std::vector<std::pair<void*, std::int64_t>> live;
      for (int i = 0; i < 1500; ++i) {
        if (live.size() == 8 || (!live.empty() && next() % 3 == 0)) {
          const std::size_t k = next() % live.size();
          const auto* p = static_cast<const unsigned char*>(live[k].first);
          const bool intact =
              std::all_of(p, p + live[k].second, [mark](unsigned char v) { return v == mark; });
          if (!intact) ++wrong[static_cast<std::size_t>(t)];
          pool.free(live[k].first, {});
          live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
        } else {
          // Mostly small requests, every eighth one large (up to 3 MiB).
          const std::uint64_t limit = next() % 8 == 0 ? 3 * MiB : 64 * KiB;
          const auto bytes = static_cast<std::int64_t>(next() % limit) + 1;
          void* p = pool.allocate(bytes, nullptr).ptr;
          std::memset(p, mark, static_cast<std::size_t>(bytes));
          live.emplace_back(p, bytes);
        }
      }
      for (auto& [p, bytes] : live) pool.free(p, {});
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) CHECK(wrong[static_cast<std::size_t>(t)] == 0);
  CHECK(pool.stats().allocated_bytes == 0);
  pool.release_cached();
  CHECK(pool.stats().reserved_bytes == 0);
  CHECK(source.mapped_bytes() == 0);
}
