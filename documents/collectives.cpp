#include "documents/collectives.hpp"

namespace shardplan::documents {
namespace {
double all_reduce_factor(int n) { return n <= 1 ? 0.0 : 2.0 * (n - 1) / n; }
double gather_factor(int n) { return n <= 1 ? 0.0 : static_cast<double>(n - 1) / n; }
double one(int n) { return n <= 1 ? 0.0 : 1.0; }
}  // namespace

const std::array<CollectiveTraits, 6>& collective_table() {
  static const std::array<CollectiveTraits, 6> table = {{
      {Collective::all_reduce, "all_reduce", "all_reduce_perf", true, all_reduce_factor},
      {Collective::all_gather, "all_gather", "all_gather_perf", false, gather_factor},
      {Collective::reduce_scatter, "reduce_scatter", "reduce_scatter_perf", false, gather_factor},
      {Collective::broadcast, "broadcast", "broadcast_perf", true, one},
      {Collective::reduce, "reduce", "reduce_perf", true, one},
      {Collective::all_to_all, "all_to_all", "alltoall_perf", false, gather_factor},
  }};
  return table;
}

const CollectiveTraits& traits(Collective op) {
  return collective_table()[static_cast<std::size_t>(op)];
}

std::optional<Collective> collective_from_name(std::string_view name) {
  for (const auto& t : collective_table())
    if (name == t.name) return t.op;
  return std::nullopt;
}

}  // namespace shardplan::documents
