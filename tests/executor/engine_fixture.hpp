// Runs the sharding engine for a few steps on a tiny model and keeps what the equivalence tests
// compare: the loss of every step and every unit's final parameters, gathered whole.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "costmodel/simulator.hpp"
#include "documents/sharding.hpp"
#include "executor/engine.hpp"
#include "executor/scaled_model.hpp"
#include "executor/stand_in_communicator.hpp"
#include "model_fixture.hpp"

namespace shardplan::executor::testing {

using namespace shardplan::kernels;

struct EngineRun {
  std::vector<double> losses;
  std::vector<StepReport> reports;
  std::vector<std::vector<float>> params;  // per unit, whole
  MemoryBreakdown at_peak;
  MemoryBreakdown category_peaks;
  std::int64_t peak_bytes = 0;
};

// Every strategy and flavour the engine runs (HSDP needs 2 ranks or more).
struct Strategy {
  const char* name;
  documents::Flavour flavour;
};
inline constexpr Strategy kStrategies[] = {{"ddp", documents::Flavour::ddp},
                                           {"zero1", documents::Flavour::deepspeed},
                                           {"zero2", documents::Flavour::deepspeed},
                                           {"zero3", documents::Flavour::deepspeed},
                                           {"fsdp-full", documents::Flavour::fsdp2},
                                           {"fsdp-full", documents::Flavour::fsdp1},
                                           {"fsdp-grad-op", documents::Flavour::fsdp2},
                                           {"hsdp", documents::Flavour::fsdp2}};

// The plan's spec for a strategy, with DeepSpeed's 1 GB buckets made small (`bucket` bytes) so a
// test exercises buckets that fill up and several reductions per bucket.
inline documents::ShardingSpec test_spec(const std::string& strategy, documents::Flavour flavour,
                                         int world, double bucket = 4096) {
  std::optional<int> group;
  if (strategy == "hsdp") group = world >= 4 && world % 2 == 0 ? 2 : 1;
  auto spec = documents::make_spec(strategy, flavour, world, group);
  if (spec.contiguous_grad_bucket) {
    spec.reduce_bucket_bytes = bucket;
    spec.allgather_bucket_bytes = bucket;
  }
  if (spec.flavour == documents::Flavour::ddp) spec.reduce_bucket_bytes = bucket;
  return spec;
}

inline EngineOptions test_options(const documents::ModelSpec& model,
                                  const documents::ShardingSpec& spec,
                                  std::int64_t grad_accumulation = 2,
                                  Checkpointing ckpt = Checkpointing::none) {
  EngineOptions o;
  o.model = model;
  o.spec = spec;
  o.micro_batch = {2, 8};
  o.grad_accumulation = grad_accumulation;
  o.checkpointing = ckpt;
  o.adamw.lr = 1e-2;  // large steps: differences between strategies show
  o.seed = 77;
  return o;
}

inline EngineRun run_engine(const EngineOptions& options, EngineGroups groups, int steps,
                            bool gather_params = true) {
  TrackedAllocator allocator;
  EngineRun r;
  {
    ShardingEngine engine(options, allocator, groups);
    for (int k = 0; k < steps; ++k) {
      r.reports.push_back(engine.step());
      r.losses.push_back(r.reports.back().loss);
    }
    if (gather_params)
      for (std::int64_t u = 0; u < engine.layout().unit_count(); ++u)
        r.params.push_back(engine.full_parameters(u));
  }
  r.at_peak = allocator.breakdown_at_peak();
  r.peak_bytes = allocator.peak_bytes();
  for (auto c : kMemoryCategories) r.category_peaks[c] = allocator.peak_bytes(c);
  return r;
}

// A rehearsal of rank `rank` of `world` ranks in this process.
inline EngineRun rehearse_engine(const EngineOptions& options, int rank, int world, int steps) {
  const int S = options.spec.group(world);
  StandInCommunicator w(rank, world), shard(rank % S, S), replica(rank / S, world / S);
  return run_engine(options, {&w, &shard, world > S ? &replica : nullptr, true}, steps, false);
}

// A small model whose head dominates the peak, as a real vocabulary makes it, with every unit a
// multiple of 4 elements (so shards of 1, 2 and 4 ranks need no padding).
inline documents::ModelSpec small_llama() {
  return scale_down(
      documents::load_model("llama-3-8b"),
      {.layers = 3, .hidden = 32, .heads = 4, .kv_heads = 2, .intermediate = 64, .vocab = 512});
}

// A CPU device for the cost model: nothing but what the memory walk and the compute model need.
inline documents::HardwareProfile cpu_profile(int ranks) {
  documents::HardwareProfile h;
  h.name = "test-cpu";
  h.memory_bytes = 1e12;
  for (auto d : {documents::DType::fp32, documents::DType::bf16, documents::DType::fp16})
    h.peak_flops[d] = 1e11;
  h.hbm_bandwidth_Bps = 1e10;
  h.compute_efficiency = 1;
  h.is_cpu = true;
  h.collectives_block = true;
  h.gpus_per_node = ranks;
  h.intra_bandwidth_Bps = h.inter_bandwidth_Bps = 1e10;
  h.intra_latency_s = h.inter_latency_s = 1e-6;
  h.host_memory_bytes = 1e12;
  h.host_link_Bps = 1e10;
  h.host_optimizer_params_per_s = 1e9;
  return h;
}

// The cost model's prediction for the engine's options on `world` ranks of that device.
inline costmodel::StepResult predict(const EngineOptions& o, int world,
                                     const documents::HardwareProfile& hw) {
  costmodel::StepInput in;
  in.model = &o.model;
  in.hardware = &hw;
  in.cluster = {world, world};
  in.job.seq_len = o.micro_batch.seq;
  in.job.micro_batch = o.micro_batch.batch;
  in.job.global_batch = o.micro_batch.batch * o.grad_accumulation * world;
  in.job.precision = o.precision;
  in.job.optimizer = documents::Optimizer::adamw;
  in.job.attention = o.model_options.flash_attention ? documents::AttentionImpl::flash
                                                     : documents::AttentionImpl::eager;
  in.job.recipe = documents::Recipe::executor;  // the executor's own model code
  in.job.checkpointing = o.checkpointing == Checkpointing::full ? documents::Checkpointing::full
                                                                : documents::Checkpointing::none;
  in.spec = o.spec;
  return costmodel::simulate_step(in);
}

// ‖a − b‖ / ‖b‖ over every unit.
inline double relative_l2(const std::vector<std::vector<float>>& a,
                          const std::vector<std::vector<float>>& b) {
  double num = 0, den = 0;
  for (std::size_t u = 0; u < a.size(); ++u)
    for (std::size_t i = 0; i < a[u].size(); ++i) {
      const double x = static_cast<double>(a[u][i]), y = static_cast<double>(b[u][i]);
      num += (x - y) * (x - y);
      den += y * y;
    }
  return std::sqrt(num / den);
}

inline double max_abs_difference(const std::vector<std::vector<float>>& a,
                                 const std::vector<std::vector<float>>& b) {
  double worst = 0;
  for (std::size_t u = 0; u < a.size(); ++u)
    for (std::size_t i = 0; i < a[u].size(); ++i)
      worst = std::max(worst, static_cast<double>(std::abs(a[u][i] - b[u][i])));
  return worst;
}

}  // namespace shardplan::executor::testing
