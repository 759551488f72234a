#include "calibrate/sweep.hpp"

#include <limits>

namespace shardplan::calibrate {

std::vector<std::uint64_t> sweep_sizes(const SweepRange& range) {
  std::vector<std::uint64_t> sizes;
  if (range.factor < 2 || range.min_bytes == 0) return sizes;
  for (std::uint64_t size = range.min_bytes; size <= range.max_bytes;) {
    sizes.push_back(size);
    if (size > std::numeric_limits<std::uint64_t>::max() / range.factor) break;
    size *= range.factor;
  }
  return sizes;
}

SweepPoint sweep_point(documents::Collective op, int ranks, std::uint64_t size_bytes,
                       std::size_t element_bytes) {
  const std::size_t count = size_bytes / element_bytes;
  const auto n = static_cast<std::size_t>(ranks);
  SweepPoint p;
  if (documents::traits(op).size_is_per_rank_buffer) {
    // all_reduce, broadcast, reduce: one buffer of `count` per rank.
    p.count = p.send_count = p.recv_count = count;
    p.size_bytes = count * element_bytes;
    return p;
  }
  const std::size_t per_rank = count / n;
  p.count = per_rank;
  p.size_bytes = per_rank * n * element_bytes;
  switch (op) {
  case documents::Collective::all_gather:
    p.send_count = per_rank;
    p.recv_count = per_rank * n;
    break;
  case documents::Collective::reduce_scatter:
    p.send_count = per_rank * n;
    p.recv_count = per_rank;
    break;
  default:  // all_to_all: count/ranks elements to and from every peer
    p.send_count = p.recv_count = per_rank * n;
    break;
  }
  return p;
}

std::vector<SweepPoint> sweep_points(documents::Collective op, int ranks, const SweepRange& range,
                                     std::size_t element_bytes) {
  std::vector<SweepPoint> points;
  for (std::uint64_t size : sweep_sizes(range)) {
    const SweepPoint p = sweep_point(op, ranks, size, element_bytes);
    if (p.count == 0) continue;
    if (!points.empty() && points.back().size_bytes == p.size_bytes) continue;
    points.push_back(p);
  }
  return points;
}

}  // namespace shardplan::calibrate
