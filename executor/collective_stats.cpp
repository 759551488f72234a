#include "executor/collective_stats.hpp"

namespace shardplan::executor {

const char* collective_kind_name(CollectiveKind kind) {
  switch (kind) {
  case CollectiveKind::all_gather:
    return "all_gather";
  case CollectiveKind::reduce_scatter:
    return "reduce_scatter";
  case CollectiveKind::all_reduce:
    return "all_reduce";
  case CollectiveKind::other:
    return "other";
  }
  return "?";
}

double CollectiveStats::seconds() const {
  double s = 0;
  for (const auto& k : kinds) s += k.seconds;
  return s;
}

CollectiveStats& CollectiveStats::operator+=(const CollectiveStats& other) {
  for (std::size_t i = 0; i < kinds.size(); ++i) {
    kinds[i].calls += other.kinds[i].calls;
    kinds[i].seconds += other.kinds[i].seconds;
    kinds[i].size_bytes += other.kinds[i].size_bytes;
    kinds[i].bytes_sent += other.kinds[i].bytes_sent;
  }
  return *this;
}

}  // namespace shardplan::executor
