// The points of a size sweep, with nccl-tests' conventions (src/common.cu and each test's
// GetCollByteCount): sizes run from min to max, multiplied by the factor each step; at each size
// the element count is size / element size, and the collectives that split a buffer among the
// ranks use count / ranks elements per rank, so their size is rounded down to a multiple of
// ranks × element size. The "size" of a point is nccl-tests' size column: the per-rank buffer for
// all-reduce, broadcast and reduce; the whole gathered or scattered buffer otherwise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "documents/collectives.hpp"

namespace shardplan::calibrate {

struct SweepRange {
  std::uint64_t min_bytes = 8;
  std::uint64_t max_bytes = 8ULL << 20;
  std::uint64_t factor = 2;  // integer, ≥ 2
};

struct SweepPoint {
  std::uint64_t size_bytes = 0;  // nccl-tests' size column
  std::size_t count = 0;         // its count column: elements per rank argument of the call
  std::size_t send_count = 0;    // elements in each rank's send buffer
  std::size_t recv_count = 0;    // elements in each rank's receive buffer
};

// Sizes min, min·f, min·f², … ≤ max.
std::vector<std::uint64_t> sweep_sizes(const SweepRange& range);
// The point of `op` on `ranks` ranks for a sweep size; count 0 when the size is too small to give
// every rank one element (nccl-tests would run it empty; calibrate skips it).
SweepPoint sweep_point(documents::Collective op, int ranks, std::uint64_t size_bytes,
                       std::size_t element_bytes);
// Every non-empty point of the sweep for `op`, without repeated sizes.
std::vector<SweepPoint> sweep_points(documents::Collective op, int ranks, const SweepRange& range,
                                     std::size_t element_bytes);

}  // namespace shardplan::calibrate
