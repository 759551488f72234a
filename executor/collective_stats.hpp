// What the engine's collectives cost on this rank: calls, seconds, and bytes per collective kind.
// Sizes follow nccl-tests (documents/collectives.hpp): the per-rank buffer for all-reduce, the
// whole gathered or scattered buffer for all-gather and reduce-scatter; bytes sent per rank are
// size × the ring's bus factor, the same count the cost model's comm_bytes_per_gpu adds up.
#pragma once

#include <array>
#include <cstdint>

#include "documents/collectives.hpp"

namespace shardplan::executor {

// The kinds the run document reports (the collectives the sharding engine issues).
enum class CollectiveKind { all_gather, reduce_scatter, all_reduce, other };
inline constexpr std::size_t kCollectiveKindCount = 4;
const char* collective_kind_name(CollectiveKind kind);  // "all_gather", ...

struct CollectiveTally {
  std::int64_t calls = 0;
  double seconds = 0;
  double size_bytes = 0;  // sum of nccl-tests sizes
  double bytes_sent = 0;  // sum of size × bus factor
};

struct CollectiveStats {
  std::array<CollectiveTally, kCollectiveKindCount> kinds{};
  CollectiveTally& operator[](CollectiveKind k) { return kinds[static_cast<std::size_t>(k)]; }
  const CollectiveTally& operator[](CollectiveKind k) const {
    return kinds[static_cast<std::size_t>(k)];
  }
  double seconds() const;  // all kinds
  CollectiveStats& operator+=(const CollectiveStats& other);
};

}  // namespace shardplan::executor
