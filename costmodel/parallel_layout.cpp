#include "costmodel/parallel_layout.hpp"
#include "documents/job.hpp"
#include "documents/parallel.hpp"

#include <algorithm>

namespace shardplan::costmodel {

using documents::Cluster;
using documents::ParallelLayout;
namespace {

// Ranks of a group of n spaced `stride` apart that share one node of G.
int per_node(int n, int stride, int G) {
  if (G <= 0 || stride >= G) return 1;
  return std::max(1, std::min(n, G / stride));
}

}  // namespace

LayoutGroups layout_groups(const ParallelLayout& l, const Cluster& c) {
  const int G = c.gpus_per_node > 0 ? c.gpus_per_node : c.gpus;
  const int t = l.tensor_parallel, cp = l.context_parallel, p = l.pipeline_parallel;
  const int d = std::max(1, l.data_parallel(c.gpus));
  LayoutGroups g;
  g.tensor = {t, per_node(t, 1, G)};
  g.context = {cp, per_node(cp, t, G)};
  g.data = {d, per_node(d, t * cp, G)};
  g.data_context = {d * cp, per_node(d * cp, t, G)};
  g.pipeline = {p, per_node(p, t * cp * d, G)};
  g.pipeline_crosses_nodes = p > 1 && t * cp * d >= G;
  return g;
}

}  // namespace shardplan::costmodel
