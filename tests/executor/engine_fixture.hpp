// Runs the sharding engine for a few steps on a tiny model and keeps what the equivalence tests
// compare: the loss of every step and every unit's final parameters, gathered whole.
#pragma once

#include <string>
#include <vector>

#include "costmodel/sharding.hpp"
#include "executor/engine.hpp"
#include "executor/stand_in_communicator.hpp"
#include "model_fixture.hpp"

namespace shardplan::executor::testing {

struct EngineRun {
  std::vector<double> losses;
  std::vector<std::vector<float>> params; // per unit, whole
  MemoryBreakdown at_peak;
  MemoryBreakdown category_peaks;
  std::int64_t peak_bytes = 0;
};

// The plan's spec for a strategy, with DeepSpeed's 1 GB buckets made small (`bucket` bytes) so a
// test exercises buckets that fill up and several reductions per bucket.
inline costmodel::ShardingSpec test_spec(const std::string& strategy, costmodel::Flavour flavour,
                                         int world, double bucket = 4096) {
  std::optional<int> group;
  if (strategy == "hsdp")
    group = world >= 4 && world % 2 == 0 ? 2 : 1;
  auto spec = costmodel::make_spec(strategy, flavour, world, group);
  if (spec.contiguous_grad_bucket) {
    spec.reduce_bucket_bytes = bucket;
    spec.allgather_bucket_bytes = bucket;
  }
  if (spec.flavour == costmodel::Flavour::ddp)
    spec.reduce_bucket_bytes = bucket;
  return spec;
}

inline EngineOptions test_options(const costmodel::ModelSpec& model,
                                  const costmodel::ShardingSpec& spec,
                                  std::int64_t grad_accumulation = 2,
                                  Checkpointing ckpt = Checkpointing::none) {
  EngineOptions o;
  o.model = model;
  o.spec = spec;
  o.micro_batch = {2, 8};
  o.grad_accumulation = grad_accumulation;
  o.checkpointing = ckpt;
  o.adamw.lr = 1e-2; // large steps: differences between strategies show
  o.seed = 77;
  return o;
}

inline EngineRun run_engine(const EngineOptions& options, EngineGroups groups, int steps,
                            bool gather_params = true) {
  TrackedAllocator allocator;
  EngineRun r;
  {
    ShardingEngine engine(options, allocator, groups);
    for (int k = 0; k < steps; ++k)
      r.losses.push_back(engine.step().loss);
    if (gather_params)
      for (std::int64_t u = 0; u < engine.layout().unit_count(); ++u)
        r.params.push_back(engine.full_parameters(u));
  }
  r.at_peak = allocator.breakdown_at_peak();
  r.peak_bytes = allocator.peak_bytes();
  for (auto c : kMemoryCategories)
    r.category_peaks[c] = allocator.peak_bytes(c);
  return r;
}

// A rehearsal of rank `rank` of `world` ranks in this process.
inline EngineRun rehearse_engine(const EngineOptions& options, int rank, int world, int steps) {
  const int S = options.spec.group(world);
  StandInCommunicator w(rank, world), shard(rank % S, S), replica(rank / S, world / S);
  return run_engine(options, {&w, &shard, world > S ? &replica : nullptr, true}, steps, false);
}

inline double max_abs_difference(const std::vector<std::vector<float>>& a,
                                 const std::vector<std::vector<float>>& b) {
  double worst = 0;
  for (std::size_t u = 0; u < a.size(); ++u)
    for (std::size_t i = 0; i < a[u].size(); ++i)
      worst = std::max(worst, static_cast<double>(std::abs(a[u][i] - b[u][i])));
  return worst;
}

} // namespace shardplan::executor::testing
