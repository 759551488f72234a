#include "costmodel/parallel_layout.hpp"

#include <algorithm>

#include "documents/job.hpp"
#include "documents/mesh.hpp"
#include "documents/parallel.hpp"

namespace shardplan::costmodel {

using documents::Cluster;
using documents::Dim;
using documents::Mesh;
using documents::ParallelLayout;
LayoutGroups layout_groups(const ParallelLayout& l, const Cluster& c) {
  const int G = c.gpus_per_node > 0 ? c.gpus_per_node : c.gpus;
  const int d = std::max(1, l.data_parallel(c.gpus));
  const Mesh m(l.pipeline_parallel, 1, d, l.context_parallel, l.tensor_parallel);
  auto group = [&](std::initializer_list<Dim> dims) {
    return Group{m.group_size(dims), m.ranks_per_node(dims, G)};
  };
  LayoutGroups g;
  g.tensor = group({Dim::tensor});
  g.context = group({Dim::context});
  g.data = group({Dim::replicate, Dim::shard});
  g.data_context = group({Dim::replicate, Dim::shard, Dim::context});
  g.pipeline = group({Dim::pipeline});
  g.pipeline_crosses_nodes = l.pipeline_parallel > 1 && m.stride(Dim::pipeline) >= G;
  return g;
}

}  // namespace shardplan::costmodel
