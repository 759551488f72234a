// The device mesh: which ranks form each parallel dimension's groups. One order for the cost model
// and the executor, torchtitan's (torchtitan/distributed/parallel_dims.py, ParallelDims: pp,
// dp_replicate, dp_shard, cp, tp from the outermost to the innermost), as torch's DeviceMesh lays a
// world out: rank = ((((pp·R + replicate)·S + shard)·C + context)·T + tensor). Consecutive ranks
// share a node, so a tensor-parallel group stays inside one and pipeline neighbours are the
// farthest apart. The data-parallel ranks are replicate × shard: HSDP shards over S and
// replicates over R; plain data parallelism is R = 1 (ZeRO and FSDP shard over all of them).
#pragma once

#include <array>
#include <initializer_list>

namespace shardplan::documents {

enum class Dim { pipeline, replicate, shard, context, tensor };  // outermost first
constexpr int kDims = 5;

class Mesh {
public:
  // Sizes in the order of Dim; each at least 1.
  Mesh(int pipeline, int replicate, int shard, int context, int tensor);

  int size() const;       // ranks in the mesh
  int size(Dim d) const;  // of one dimension
  // Ranks between two neighbours of the dimension: the product of the sizes inside it.
  int stride(Dim d) const;
  int coordinate(int rank, Dim d) const;

  // A group along `dims`: the ranks that share every other coordinate. `color` is the same for
  // the group's ranks and differs between groups (the other coordinates in mesh order), `key`
  // orders the ranks in it (the group's own coordinates in mesh order): a communicator's
  // split(color, key) makes it.
  struct Split {
    int color = 0, key = 0;
  };
  Split split(int rank, std::initializer_list<Dim> dims) const;
  // Ranks in a group along `dims`.
  int group_size(std::initializer_list<Dim> dims) const;
  // Of a group along `dims`, the ranks on one node of `gpus_per_node` consecutive ranks: its
  // innermost dimension's neighbours are stride apart, so min(n, G / stride) share a node (1 once
  // the stride reaches a node).
  int ranks_per_node(std::initializer_list<Dim> dims, int gpus_per_node) const;

private:
  std::array<int, kDims> sizes_{};
};

}  // namespace shardplan::documents
