// How the units' flat buffers are split over a shard group: every unit (the embeddings, each
// block, the head) is one flat fp32 buffer in GptLayout order, padded with zeros to a multiple of
// the shard-group size S, so any rank count works. Rank s of the group owns the chunk
// [s·padded/S, (s+1)·padded/S) of every unit whose state is sharded: its parameters when
// parameters are sharded, its gradients and optimizer states when those are. This is the FSDP1
// FlatParameter's layout (torch/distributed/fsdp/_flat_param.py: flatten, pad to a multiple of
// the world size, chunk) and DeepSpeed ZeRO-3's (each parameter padded to a multiple of the world
// size: deepspeed/runtime/zero/partition_parameters.py, _partition_param).
//
// Small tensors (ZeRO-3's stage3_param_persistence_threshold): a unit whose tensors are ALL below
// the threshold is never partitioned: every rank keeps it whole and it is never gathered (the cost
// model's persistent elements). A unit with at least one tensor at or above the threshold is
// partitioned as a whole, its small tensors included (one flat buffer cannot hold a gathered part
// and a persistent part). DeepSpeed keeps each small tensor whole instead; the cost model follows
// DeepSpeed for the frameworks' recipes and this rule for the executor's
// (costmodel/accounting.hpp, persistent_unit_elements). Persistent units are all-gathered from
// their updated chunks after the optimizer step, as DeepSpeed gathers its persistent tensors.
#pragma once

#include <cstdint>
#include <vector>

#include "documents/sharding.hpp"
#include "executor/model_layout.hpp"

namespace shardplan::executor {

struct UnitShards {
  std::int64_t size = 0;        // n, elements of the unit
  std::int64_t padded = 0;      // n rounded up to a multiple of S
  std::int64_t chunk = 0;       // padded / S, one rank's part
  bool params_sharded = false;  // parameters partitioned at rest, all-gathered before use
};

struct ShardLayout {
  int world = 1;                  // ranks in the job
  int group = 1;                  // S, ranks of a shard group (HSDP: fewer than the world)
  int replicas = 1;               // world / S
  int shard_rank = 0;             // this rank's index in its shard group: world rank % S
  int replica_rank = 0;           // its shard group's index: world rank / S
  std::vector<UnitShards> units;  // 0 the embedding, 1..L the blocks, L + 1 the head

  // Whole-unit buffers hold `padded` elements where a rank updates only its chunk and the chunks
  // are then all-gathered in place (sharded optimizer); otherwise exactly `size`.
  std::int64_t whole_elements(std::int64_t unit, const documents::ShardingSpec& spec) const;
  // First element of this rank's chunk of a unit.
  std::int64_t chunk_begin(std::int64_t unit) const;
};

// Throws std::invalid_argument when the group does not divide the world or the rank is outside it.
ShardLayout make_shard_layout(const GptLayout& layout, const documents::ShardingSpec& spec,
                              int world, int world_rank);

}  // namespace shardplan::executor
