// Per-collective traits, as nccl-tests defines them (src/*.cu, doc/PERFORMANCE.md). One table
// serves `calibrate` (algbw/busbw columns, bytes of a sweep point) and the cost model (time of a
// collective, bytes each rank sends).
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>

namespace shardplan::documents {

enum class Collective { all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all };
constexpr int kCollectives = 6;

struct CollectiveTraits {
  Collective op;
  const char* name;        // "all_reduce": the name in profiles and on the command line
  const char* nccl_tests;  // the nccl-tests binary that measures it ("all_reduce_perf")
  // What nccl-tests calls the "size" of a point: true when it is the per-rank buffer
  // (all-reduce, broadcast, reduce), false when it is the whole gathered/scattered buffer
  // (all-gather output, reduce-scatter input, all-to-all).
  bool size_is_per_rank_buffer;
  // busbw = algbw × factor(n): 2(n−1)/n all-reduce; (n−1)/n all-gather, reduce-scatter,
  // all-to-all; 1 broadcast and reduce. For a ring this is also bytes sent per rank / size.
  double (*bus_factor)(int ranks);
};

const std::array<CollectiveTraits, kCollectives>& collective_table();
const CollectiveTraits& traits(Collective op);
std::optional<Collective> collective_from_name(std::string_view name);

// nccl-tests' bandwidths: bytes in GB (1e9) per second.
inline double algbw_GBps(double size_bytes, double seconds) { return size_bytes / seconds / 1e9; }
inline double busbw_GBps(Collective op, int ranks, double size_bytes, double seconds) {
  return algbw_GBps(size_bytes, seconds) * traits(op).bus_factor(ranks);
}
// Bytes one rank sends for a collective of nccl-tests size `size_bytes` on a ring of `ranks`.
inline double bytes_sent_per_rank(Collective op, int ranks, double size_bytes) {
  return size_bytes * traits(op).bus_factor(ranks);
}

}  // namespace shardplan::documents
