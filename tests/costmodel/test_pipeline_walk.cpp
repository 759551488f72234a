// torchtitan's pipelines through the step walk (pipeline_walk.hpp), as `planner estimate` and the
// search cost them (simulate_parallel_step, parallel_step_bound).
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>

#include "costmodel/parallel_step.hpp"
#include "tests/test_support.hpp"

using namespace shardplan::costmodel;
using namespace shardplan::documents;

namespace {

// Llama-3-8B (32 blocks) on H100s under torchtitan's recipe, bf16, flash attention.
struct Job {
  ModelSpec model = load_model("llama-3-8b");
  HardwareProfile hw = load_hardware("h100-sxm5-80gb");
  StepInput in;
  Job(int gpus, std::int64_t global, const std::string& strategy, Checkpointing ckpt) {
    in.model = &model;
    in.hardware = &hw;
    in.cluster = {gpus, 8};
    in.job.seq_len = 4096;
    in.job.global_batch = global;
    in.job.micro_batch = 1;
    in.job.recipe = Recipe::torchtitan;
    in.job.loss = recipe_traits(Recipe::torchtitan).loss;
    in.job.checkpointing = ckpt;
    in.spec = make_spec(strategy,
                        strategy == "fsdp-full" ? std::optional(Flavour::fsdp2) : std::nullopt, 8);
  }
};

ParallelLayout pipeline(int t, int p, int v, int m) {
  ParallelLayout l;
  l.tensor_parallel = t;
  l.sequence_parallel = t > 1;
  l.pipeline_parallel = p;
  l.virtual_stages = v;
  l.schedule = v > 1 ? PipelineSchedule::interleaved_1f1b : PipelineSchedule::one_f_one_b;
  l.micro_batches = m;
  apply_recipe_split(l, Recipe::torchtitan);
  return l;
}

}  // namespace

// The search passes over a pipeline whose bound is above the plans it keeps, so the bound must
// never exceed the walk's step: over strategies, checkpointing modes, t, p, v and m.
TEST_CASE("pipeline_walk::the search's bound is below every walked step") {
  int compared = 0;
  for (const char* strategy : {"ddp", "zero1", "fsdp-full"})
    for (const Checkpointing ckpt :
         {Checkpointing::none, Checkpointing::selective_op, Checkpointing::full})
      for (const auto& tpv :
           {std::array{1, 2, 1}, std::array{2, 4, 1}, std::array{1, 4, 2}, std::array{2, 2, 3}})
        for (const int m : {4, 8}) {
          const int t = tpv[0], p = tpv[1], v = tpv[2];
          const int gpus = t * p * 2;  // two replicas
          Job j(gpus, 2 * std::int64_t{m}, strategy, ckpt);
          const ParallelLayout l = pipeline(t, p, v, m);
          const auto walked = simulate_parallel_step(j.in, l);
          REQUIRE(walked.step.valid);
          const double bound = parallel_step_bound(j.in, l);
          CAPTURE(strategy);
          CAPTURE(t);
          CAPTURE(p);
          CAPTURE(v);
          CAPTURE(m);
          CHECK(bound > 0);
          CHECK(bound <= walked.step.step_s);
          // Not a bound that prunes nothing: the compute of the busiest stage at least.
          CHECK(bound >= 0.5 * walked.step.compute_s);
          ++compared;
        }
  CHECK(compared == 72);
}

// FSDP under torchtitan's pipeline gathers each unit of the stage once and keeps it to the last
// backward (torchtitan's "default" reshard_after_forward is False with pipeline parallelism;
// torch's pipelining stages reshard only after the last backward): at the stage's peak every
// unit of stage 1 (16 of Llama-3-8B's blocks and the head: 16·218,112,000 + 525,340,672 =
// 4,015,132,672 elements, of which all but the norms are sharded) is gathered in bf16; one of the
// two ranks' shards stays as its parameters.
TEST_CASE("pipeline_walk::FSDP keeps a stage's units gathered through its micro-batches") {
  Job j(4, 8, "fsdp-full", Checkpointing::full);
  const ParallelLayout l = pipeline(1, 2, 1, 4);
  const auto r = simulate_parallel_step(j.in, l);
  REQUIRE(r.step.valid);
  const StageMemory& last = r.memory.stages.at(1);
  // The gathered units at 2 bytes per element: at least every sharded matrix of the stage.
  const double matrices = 16 * 218103808.0 + 525336576.0;
  CHECK(last.buffer_bytes >= 2 * matrices);
  CHECK(last.buffer_bytes < 2 * matrices + 4 * 16777216.0);  // + small transients
}

// The step is the stage that ends last; its time is its compute, its waits for other stages (the
// bubble) and the waits for each stream's communication the walk names, which add up to it.
TEST_CASE("pipeline_walk::a stage's step is its compute, its bubble and its exposed time") {
  Job j(16, 16, "zero1", Checkpointing::selective_op);
  const ParallelLayout l = pipeline(2, 4, 1, 8);
  const auto r = simulate_parallel_step(j.in, l);
  INFO(r.step.reason);
  REQUIRE(r.step.valid);
  CHECK(r.bubble_s > 0);
  double exposed = 0;
  for (const double e : r.step.exposed_s) exposed += e;
  CHECK(exposed == doctest::Approx(r.step.exposed_comm_s).epsilon(1e-9));
  CHECK(r.step.compute_s + r.bubble_s + exposed == doctest::Approx(r.step.step_s).epsilon(1e-9));
  // 1F1B: stage s holds p − s micro-batches at most.
  CHECK(r.walk.peak_chunks == std::vector<int>{4, 3, 2, 1});
}
