// From a plan document to what the executor runs, refusing what it cannot run as asked (never
// silently something else). The checks, each an InputError naming the plan's JSON pointer:
//   /job/precision       fp32 (the CUDA backend's GEMMs in TF32, as the cost model's fp32
//                        assumes), bf16-mixed or fp16-mixed (engine.hpp); not pure bf16
//   /sharding/reduce_dtype   under mixed precision, the type the gradients are reduced in
//                        (engine.hpp, precision_policy)
//   /job/optimizer       adamw only
//   /job/checkpointing   none or full (selective recompute is not implemented)
//   /sharding/offload    the CPU backend: none, optimizer or params (host_offload.hpp); the
//                        CUDA backend: none
//   /cluster/gpus        must equal the ranks launched (or --world of a rehearsal)
//   /model               a bare parameter count has no architecture to run
// What it runs differently and says so in the run document (`deviations`): an fp32 job's
// gradients are reduced in fp32 whatever /sharding/reduce_dtype says; dropout is not
// applied; on the CPU the gathers are not issued ahead unless asked (engine.hpp, prefetch); on a
// GPU they always are, as the plan says.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "documents/plan.hpp"
#include "executor/engine.hpp"
#include "executor/scaled_model.hpp"

namespace shardplan::executor {

struct RunRequest {
  std::int64_t steps = 3;
  std::uint64_t seed = 1234;
  std::optional<ScaledSize> scale;        // run a scaled copy of the plan's model
  std::optional<std::int64_t> scale_seq;  // and a shorter sequence
  bool prefetch_as_planned = false;
  // The cpu backend under mpirun: each group's collectives on a thread of its own
  // (comm/host_stream.hpp), overlapping the compute as a GPU's streams do; the gathers are then
  // issued ahead as the plan says.
  bool collective_streams = false;
  double lr = 1e-3;
  bool gpu = false;  // the CUDA backend (executor --backend cuda)
  // Tensor parallelism over t consecutive ranks (tensor_parallel.hpp), data parallelism as the
  // plan's ShardingSpec over the world / t ranks with the same TP rank; sequence parallelism
  // with it (executor --tensor-parallel T --sequence-parallel, the planner's flags).
  int tensor_parallel = 1;
  bool sequence_parallel = false;
  // Context parallelism (context_parallel.hpp): c ranks share each sequence; the mesh is
  // (dp, cp, tp) and the plan's ShardingSpec runs over the world / t ranks with the same TP rank
  // (executor --context-parallel C).
  int context_parallel = 1;
};

struct RunSetup {
  documents::Plan plan;
  EngineOptions engine;
  int world = 1;
  std::int64_t global_batch = 0;        // sequences per step in the run
  bool scaled = false;                  // the run's model or sequence differs from the plan's
  std::vector<std::string> deviations;  // what runs differently from the plan, in words
};

// Throws core::InputError (bad or unrunnable plan, bad scale).
RunSetup make_run_setup(const nlohmann::json& plan_document, int world, const RunRequest& request);

// The fewest bytes one rank of the run must hold at once, as the executor allocates them
// (gpt_model.hpp): its share of the fp32 parameters, a block's input and output and the head's
// logits and log-probabilities for one micro-batch. Computed in doubles: no size of a
// scaled run (--seq-len 2147483648) wraps.
double least_rank_bytes(const RunSetup& setup);
// Refuses, before anything is allocated, a run whose least_rank_bytes exceed the host's memory
// (host_memory_bytes; 0: unknown), naming what made it that big: --seq-len, the model size flags,
// or the plan's /job/seq_len. A run past --gpu-memory-GiB but within the host still runs into its
// out-of-memory error (exit code 3), as a device of that size would.
void check_run_size(const RunSetup& setup, const RunRequest& request, double host_memory_bytes);

}  // namespace shardplan::executor
