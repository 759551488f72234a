// Time of one collective on a group of ranks: from the profile's calibrated curves where they
// cover the group, otherwise from the datasheet with NCCL's alpha-beta shape
// (src/graph/tuning.cc: time = latency × steps + bytes / bandwidth).
#pragma once

#include <string>

#include "documents/collectives.hpp"
#include "documents/hardware.hpp"

namespace shardplan::costmodel {

// A communication group: `ranks` in all, `ranks_per_node` of them on each node they span.
struct Group {
  int ranks = 1;
  int ranks_per_node = 1;
  int nodes() const { return (ranks + ranks_per_node - 1) / ranks_per_node; }
  documents::Tier tier() const {
    return nodes() > 1 ? documents::Tier::inter_node : documents::Tier::intra_node;
  }
};

struct CollectiveCost {
  double seconds = 0;
  double bytes_sent = 0;      // per rank, on the wire (ring)
  bool calibrated = false;    // from measured curves
  bool extrapolated = false;  // the group size lies outside the measured ones
};

class CommModel {
public:
  explicit CommModel(const documents::HardwareProfile& hw) : hw_(&hw) {}
  // size_bytes in nccl-tests' sense (collectives.hpp): the per-rank buffer for all-reduce, the
  // whole gathered/scattered buffer for all-gather and reduce-scatter.
  CollectiveCost cost(documents::Collective op, const Group& g, double size_bytes) const;
  // Datasheet-only cost (what cost() falls back to), exposed for tests and comparisons.
  CollectiveCost datasheet_cost(documents::Collective op, const Group& g, double size_bytes) const;

private:
  const documents::HardwareProfile* hw_;
};

}  // namespace shardplan::costmodel
