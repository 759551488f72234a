// From a plan document to what the CPU executor runs, refusing what it cannot run as asked (never
// silently something else). The checks, each an InputError naming the plan's JSON pointer:
//   /job/precision       fp32 only: the CPU backend computes, stores and reduces in fp32
//   /job/optimizer       adamw only
//   /job/attention       eager only: the executor materialises the attention scores (a·s² per
//                        sequence); a plan for flash attention predicts memory it would not use
//   /job/checkpointing   none or full (selective recompute is not implemented)
//   /sharding/offload    none: the CPU executor has no host/device split to offload across
//   /cluster/gpus        must equal the ranks launched (or --world of a rehearsal)
//   /model               a bare parameter count has no architecture to run
// What it runs differently and says so in the run document (`deviations`): gradients are reduced
// in fp32 whatever /sharding/reduce_dtype says (MPI on fp32 buffers); dropout is not applied; the
// gathers are not issued ahead on a blocking backend unless asked (engine.hpp, prefetch).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "costmodel/plan.hpp"
#include "executor/engine.hpp"
#include "executor/scaled_model.hpp"

namespace shardplan::executor {

struct RunRequest {
  std::int64_t steps = 3;
  std::uint64_t seed = 1234;
  std::optional<ScaledSize> scale;       // run a scaled copy of the plan's model
  std::optional<std::int64_t> scale_seq; // and a shorter sequence
  bool prefetch_as_planned = false;
  double lr = 1e-3;
};

struct RunSetup {
  costmodel::Plan plan;
  EngineOptions engine;
  int world = 1;
  std::int64_t global_batch = 0;       // sequences per step in the run
  bool scaled = false;                 // the run's model or sequence differs from the plan's
  std::vector<std::string> deviations; // what runs differently from the plan, in words
};

// Throws costmodel::InputError (bad or unrunnable plan, bad scale).
RunSetup make_run_setup(const nlohmann::json& plan_document, int world, const RunRequest& request);

} // namespace shardplan::executor
