// Where a plan's parallel dimensions (documents/parallel.hpp) put their groups on the cluster's
// nodes, for the collectives' tiers, by the device mesh the executor splits its ranks with
// (documents/mesh.hpp: pp, dp, cp, tp from the outermost; consecutive ranks share a node, so TP
// groups never leave a node and pipeline neighbours are t·c·d ranks apart).
#pragma once

#include "costmodel/comm_model.hpp"
#include "documents/job.hpp"
#include "documents/parallel.hpp"

namespace shardplan::costmodel {

// The groups of each dimension, on nodes of `gpus_per_node` (Mesh::ranks_per_node).
struct LayoutGroups {
  Group tensor, context, data, pipeline;
  // The d·c ranks at one tensor-parallel position that average the gradients and shard the
  // states: data and context parallelism together (Megatron-core's dp-cp group,
  // megatron/core/parallel_state.py; torchtitan's dp_shard_cp mesh that FSDP shards over).
  Group data_context;
  bool pipeline_crosses_nodes = false;  // neighbouring stages sit on different nodes
};
LayoutGroups layout_groups(const documents::ParallelLayout& l, const documents::Cluster& c);

}  // namespace shardplan::costmodel
