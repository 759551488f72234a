#include "calibrate/group_plan.hpp"

#include <algorithm>
#include <map>
#include <stdexcept>

#include <fmt/format.h>

#include "core/input_error.hpp"

namespace shardplan::calibrate {

std::vector<comm::GroupSpec> default_groups(const comm::Topology& topology) {
  std::vector<comm::GroupSpec> groups = {{comm::GroupKind::world, 0}};
  if (topology.nodes > 1) {
    groups.push_back({comm::GroupKind::intra_node, 0});
    groups.push_back({comm::GroupKind::inter_node, 0});
  }
  return groups;
}

GroupPlan plan_groups(const std::vector<comm::GroupSpec>& requested,
                      const comm::Topology& topology) {
  GroupPlan plan;
  for (const auto& spec : requested.empty() ? default_groups(topology) : requested) {
    const std::string name = comm::group_name(spec);
    std::map<int, int> size_of_color;
    try {
      for (int r = 0; r < topology.size; ++r)
        ++size_of_color[comm::split_key(spec, topology, r).color];
    } catch (const std::invalid_argument& e) {
      throw core::InputError("--groups", e.what());
    }
    const int ranks = size_of_color.begin()->second;
    const bool equal = std::all_of(size_of_color.begin(), size_of_color.end(),
                                   [&](const auto& entry) { return entry.second == ranks; });
    if (!equal) {
      plan.notes.push_back(fmt::format(
          "{}: not measured: its groups differ in size (nodes run different rank counts)", name));
      continue;
    }
    if (ranks < 2) {
      plan.notes.push_back(fmt::format("{}: not measured: its groups have one rank", name));
      continue;
    }
    PlannedGroup g{spec, name, ranks, static_cast<int>(size_of_color.size()),
                   comm::max_nodes_spanned(spec, topology) > 1 ? documents::Tier::inter_node
                                                               : documents::Tier::intra_node};
    const auto same =
        std::find_if(plan.groups.begin(), plan.groups.end(),
                     [&](const PlannedGroup& p) { return p.ranks == g.ranks && p.tier == g.tier; });
    if (same != plan.groups.end()) {
      plan.notes.push_back(fmt::format("{}: not measured: same size ({}) and tier ({}) as {}", name,
                                       g.ranks, documents::tier_name(g.tier), same->name));
      continue;
    }
    plan.groups.push_back(g);
  }
  return plan;
}

}  // namespace shardplan::calibrate
