// The device memory of the CUDA backend (kernels/cuda/device_memory.hpp) on a CUDA device: the
// pool's segment rules seen through cudaMalloc, zeroing, reuse across streams ordered by the
// fences (a free on one stream, the next user on another), record_use, memmove semantics of an
// overlapping copy against std::memmove on the host, and the limit. Skipped without a CUDA device
// (gpu_test_main.cpp).
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <numeric>
#include <vector>

#include <cuda_runtime_api.h>

#include "kernels/cuda/device_memory.hpp"

namespace {

using shardplan::kernels::CachingPool;
using shardplan::kernels::PoolExhausted;
using shardplan::kernels::cuda::DeviceMemory;

constexpr std::int64_t MiB = std::int64_t{1024} * 1024;

void ok(cudaError_t code) { REQUIRE_MESSAGE(code == cudaSuccess, cudaGetErrorString(code)); }

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() { (void)cudaStreamDestroy(s); }
};

std::vector<unsigned char> bytes_of(DeviceMemory& memory, const void* p, std::int64_t n) {
  std::vector<unsigned char> host(static_cast<std::size_t>(n));
  memory.read(host.data(), p, n);
  return host;
}

bool all_equal(const std::vector<unsigned char>& v, unsigned char value) {
  for (auto b : v)
    if (b != value) return false;
  return true;
}

// Keeps `stream` busy for milliseconds: 16 passes over 1 GiB (about 0.3 ms each at H100/H200
// bandwidth, more on older GPUs), queued before the work under test.
void keep_busy(cudaStream_t stream, void* big) {
  for (int i = 0; i < 16; ++i)
    ok(cudaMemsetAsync(big, i, static_cast<std::size_t>(1024 * MiB), stream));
}

}  // namespace

TEST_CASE("kernels::cuda device memory: segments, zeroing and same-stream reuse") {
  Stream s;
  DeviceMemory memory;
  memory.set_stream(s.s);
  // 1000 B -> 1024 B in a 2 MiB segment (caching_pool.hpp's rules): one cudaMalloc.
  void* p = memory.allocate(1000, true);
  CHECK(memory.reserved_bytes() == 2 * MiB);
  CHECK(memory.allocated_bytes() == 1024);
  CHECK(memory.maps() == 1);
  CHECK(all_equal(bytes_of(memory, p, 1000), 0));
  std::vector<unsigned char> ones(1000, 1);
  memory.write(p, ones.data(), 1000);
  CHECK(all_equal(bytes_of(memory, p, 1000), 1));
  memory.free(p, 1000);
  // The same block again, zeroed again, without a second cudaMalloc.
  void* q = memory.allocate(1000, true);
  CHECK(q == p);
  CHECK(memory.maps() == 1);
  CHECK(all_equal(bytes_of(memory, q, 1000), 0));
  memory.free(q, 1000);
  CHECK(memory.allocated_bytes() == 0);
  CHECK(memory.release_cached() == 2 * MiB);
  CHECK(memory.reserved_bytes() == 0);
}

TEST_CASE("kernels::cuda device memory: a block freed on one stream waits for it on another") {
  Stream a, b;
  DeviceMemory memory;
  void* big = memory.allocate_on(a.s, 1024 * MiB, false);
  void* p = memory.allocate_on(a.s, MiB, false);
  keep_busy(a.s, big);
  ok(cudaMemsetAsync(p, 1, static_cast<std::size_t>(MiB), a.s));  // the last write of a
  memory.free(p, MiB);  // fenced on a; the host does not wait
  void* q = memory.allocate_on(b.s, MiB, false);
  CHECK(q == p);  // the same block, now for b
  ok(cudaMemsetAsync(q, 2, static_cast<std::size_t>(MiB), b.s));
  // Without the fence b's write would run at once and a's later one would win: 1 instead of 2.
  ok(cudaDeviceSynchronize());
  {
    DeviceMemory::StreamScope scope(memory, b.s);
    CHECK(all_equal(bytes_of(memory, q, MiB), 2));
  }
  memory.free(q, MiB);
  memory.free(big, 1024 * MiB);
}

TEST_CASE("kernels::cuda device memory: record_use fences the other stream too") {
  Stream a, b, c;
  DeviceMemory memory;
  void* big = memory.allocate_on(c.s, 1024 * MiB, false);
  void* p = memory.allocate_on(a.s, MiB, false);
  memory.record_use(p, c.s);
  keep_busy(c.s, big);
  ok(cudaMemsetAsync(p, 1, static_cast<std::size_t>(MiB), c.s));  // c's use, late
  memory.free(p, MiB);                                            // fenced on a and c
  void* q = memory.allocate_on(b.s, MiB, false);
  CHECK(q == p);
  ok(cudaMemsetAsync(q, 2, static_cast<std::size_t>(MiB), b.s));
  ok(cudaDeviceSynchronize());
  CHECK(all_equal(bytes_of(memory, q, MiB), 2));
  memory.free(q, MiB);
  memory.free(big, 1024 * MiB);
  int elsewhere = 0;
  CHECK_THROWS_AS(memory.record_use(&elsewhere, a.s), std::invalid_argument);
}

TEST_CASE("kernels::cuda device memory: an overlapping copy is a memmove") {
  Stream s;
  DeviceMemory memory;
  memory.set_stream(s.s);
  // 10 MiB of int32 0, 1, 2, ...: more than the 4 MiB staging block, so several pieces.
  constexpr std::int64_t kBytes = 10 * MiB;
  std::vector<std::int32_t> host(static_cast<std::size_t>(kBytes / 4));
  std::iota(host.begin(), host.end(), 0);
  auto* d = static_cast<unsigned char*>(memory.allocate(kBytes, false));
  // Shifts: dst above src (copied backwards), below (forwards), and a disjoint pair.
  const std::initializer_list<std::int64_t> shifts = {4, 3 * MiB + 12, -4, -5 * MiB - 8};
  for (std::int64_t shift : shifts) {
    CAPTURE(shift);
    memory.write(d, host.data(), kBytes);
    const std::int64_t n = kBytes - (shift < 0 ? -shift : shift);
    unsigned char* dst = shift > 0 ? d + shift : d;
    unsigned char* src = shift > 0 ? d : d - shift;
    memory.copy(dst, src, n);
    std::vector<unsigned char> want(reinterpret_cast<unsigned char*>(host.data()),
                                    reinterpret_cast<unsigned char*>(host.data()) + kBytes);
    std::memmove(want.data() + (dst - d), want.data() + (src - d), static_cast<std::size_t>(n));
    CHECK(bytes_of(memory, d, kBytes) == want);
  }
  memory.free(d, kBytes);
}

TEST_CASE("kernels::cuda device memory: the limit and what the device holds besides") {
  DeviceMemory memory(4 * MiB);
  void* p = memory.allocate(1000, false);  // 2 MiB segment: within 4 MiB
  // 3 MiB needs a 20 MiB segment: 2 + 20 > 4, and p's segment cannot be released.
  CHECK_THROWS_AS(memory.allocate(3 * MiB, false), PoolExhausted);
  CHECK(memory.reserved_bytes() == 2 * MiB);
  CHECK(memory.used_by_others() > 0);  // at least the CUDA context
  void* raw = nullptr;
  const auto info =
      DeviceMemory::measure([&] { ok(cudaMalloc(&raw, static_cast<std::size_t>(64 * MiB))); });
  CHECK(info.growth() >= 64 * MiB);  // what a step holds shows as growth
  CHECK(info.total >= info.free_before);
  ok(cudaFree(raw));
  CHECK(DeviceMemory::context_bytes() > 0);
  memory.free(p, 1000);
}
