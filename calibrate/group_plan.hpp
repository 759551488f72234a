// Which sub-groups a measuring run sweeps, and what each is in profile terms: its size (the
// curve's "ranks") and its tier (inter_node when a group spans nodes). Groups that would measure
// nothing new are dropped with a note: one rank, groups of unequal sizes (their sweeps would
// differ), or the same size and tier as a group already planned.
#pragma once

#include <string>
#include <vector>

#include "comm/groups.hpp"
#include "comm/topology.hpp"
#include "documents/hardware.hpp"

namespace shardplan::calibrate {

struct PlannedGroup {
  comm::GroupSpec spec;
  std::string name;  // "world", "shard:4"
  int ranks = 0;     // in each group
  int groups = 0;    // groups of this split, all measured at once
  documents::Tier tier = documents::Tier::intra_node;
};

struct GroupPlan {
  std::vector<PlannedGroup> groups;
  std::vector<std::string> notes;  // why a requested group is not measured
};

// The defaults when none are requested: world, plus intra_node and inter_node on several nodes.
std::vector<comm::GroupSpec> default_groups(const comm::Topology& topology);
// Throws core::InputError (--groups) when a shard size does not divide the world size.
GroupPlan plan_groups(const std::vector<comm::GroupSpec>& requested,
                      const comm::Topology& topology);

}  // namespace shardplan::calibrate
