// Context parallelism (executor/context_parallel.hpp) under mpirun: c ranks sharing every
// sequence (ring attention), times d = world / (c·t) data-parallel replicas, with and without
// tensor parallelism inside (t), train as one process does with DDP on the same global batch;
// and each rank's measured peak against costmodel/parallel_memory's prediction for the layout.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "costmodel/parallel_memory.hpp"
#include "costmodel/pipeline_schedule.hpp"
#include "engine_fixture.hpp"
#include "executor/context_parallel.hpp"
#include "executor/tensor_parallel.hpp"
#include "mpi_test_world.hpp"
#include "update_comparison.hpp"

using namespace shardplan;
using namespace shardplan::executor;
using namespace shardplan::kernels;
using namespace shardplan::executor::testing;
using documents::Flavour;

namespace {

// Tolerances, fp32: those of test_tensor_parallel_mpi.cpp (derived there and in
// update_comparison.hpp for d·t ≤ 8 ranks). Context parallelism reorders the same sums: every
// parameter gradient is the sum of the c ranks' partial sums over their tokens (the data-parallel
// reduction then runs over d·c ranks, d·c·t ≤ 8 here), each key's dK and dV the sum of c blocks'
// contributions added around the ring, and each query's softmax is folded over c key blocks
// (exact in exact arithmetic: FlashAttention-2's rescaling). The loss is the mean of the c
// ranks' means over equal token counts: the same mean.
constexpr double kLossTolerance = 1e-6;
constexpr int kSteps = 2;
constexpr std::int64_t kSequence = 16;  // tokens per sequence: 2c chunks for c = 2, 4 (and 8)

struct CpRun {
  std::vector<double> losses;
  std::vector<std::vector<float>> params;  // per unit, the full model's
  std::int64_t peak_bytes = 0;
  MemoryBreakdown at_peak;
};

EngineOptions cp_options(const documents::ModelSpec& model, int c, int t, const char* strategy,
                         Flavour flavour, std::int64_t grad_accumulation,
                         documents::Precision precision, Checkpointing checkpointing) {
  const int d = test_world().size() / (c * t);
  auto o = test_options(t > 1 ? local_spec(model, t) : model, test_spec(strategy, flavour, d * c),
                        grad_accumulation, checkpointing);
  o.micro_batch = {2, kSequence / c};
  o.precision = precision;
  o.model_options.flash_attention = true;
  return o;
}

// c-way context parallelism, t-way tensor parallelism inside, `strategy` over the d·c ranks with
// the same TP rank.
CpRun run_context_parallel(const documents::ModelSpec& model, int c, int t,
                           const char* strategy = "ddp", Flavour flavour = Flavour::ddp,
                           std::int64_t grad_accumulation = 2,
                           documents::Precision precision = documents::Precision::fp32,
                           Checkpointing checkpointing = Checkpointing::none) {
  auto o = cp_options(model, c, t, strategy, flavour, grad_accumulation, precision, checkpointing);
  auto cp_groups = make_context_parallel_groups(test_world(), c, t);
  TensorParallelGroups tp_groups;
  if (t > 1) {
    tp_groups = make_tensor_parallel_groups(test_world(), t);
    o.model_options.tensor_parallel = {tp_groups.tp.get(), false,
                                       std::make_shared<const GptLayout>(model)};
  }
  o.model_options.context_parallel = {cp_groups.context.get()};
  auto owned = make_groups(*cp_groups.data, o.spec);
  CpRun r;
  TrackedAllocator allocator;
  {
    ShardingEngine engine(o, allocator, owned.groups);
    for (int k = 0; k < kSteps; ++k) r.losses.push_back(engine.step().loss);
    for (std::int64_t u = 0; u < engine.layout().unit_count(); ++u)
      r.params.push_back(gather_full_unit(o.model_options.tensor_parallel, engine.layout(), u,
                                          engine.full_parameters(u)));
  }
  r.peak_bytes = allocator.peak_bytes();
  r.at_peak = allocator.breakdown_at_peak();
  return r;
}

// DDP in one process over the same global batch (whole sequences): d × grad_accumulation
// micro-batches; `initial`: its parameters before the first step.
struct AloneRun {
  std::vector<double> losses;
  std::vector<std::vector<float>> params, initial;
};
AloneRun run_alone(const documents::ModelSpec& model, int d, std::int64_t grad_accumulation,
                   documents::Precision precision = documents::Precision::fp32) {
  auto self = test_world().split(test_world().rank(), 0);
  auto o = test_options(model, test_spec("ddp", Flavour::ddp, 1), grad_accumulation * d);
  o.micro_batch = {2, kSequence};
  o.precision = precision;
  o.model_options.flash_attention = true;
  const auto run = run_engine(o, {self.get(), self.get(), nullptr, false}, kSteps);
  const auto initial = run_engine(o, {self.get(), self.get(), nullptr, false}, 0);
  return {run.losses, run.params, initial.params};
}

WorstSeen worst_seen;  // over the comparisons since the last report

void check_equal(const documents::ModelSpec& model, const CpRun& a, const AloneRun& alone) {
  REQUIRE(a.losses.size() == alone.losses.size());
  REQUIRE(a.params.size() == alone.params.size());
  for (std::size_t k = 0; k < a.losses.size(); ++k) {
    CHECK(a.losses[k] == doctest::Approx(alone.losses[k]).epsilon(kLossTolerance));
    worst_seen.loss = std::max(worst_seen.loss, std::abs(a.losses[k] / alone.losses[k] - 1));
  }
  for (std::size_t u = 0; u < a.params.size(); ++u)
    REQUIRE(a.params[u].size() == alone.params[u].size());
  worst_seen.check(compare_updates(GptLayout(model), alone.initial, a.params, alone.params));
}

void report(const std::string& what) {
  if (test_world().rank() == 0)
    MESSAGE(test_world().size() << " ranks, " << what << ": " << worst_seen.text());
  worst_seen = {};
}

// Llama-like with 8 query heads over 4 key/value heads (as test_tensor_parallel_mpi.cpp's), and
// a vocabulary of 48, a multiple of t = 2.
documents::ModelSpec llama_8_heads() {
  return scale_down(documents::load_model("llama-3-8b"), {.layers = 2,
                                                          .hidden = 16,
                                                          .heads = 8,
                                                          .kv_heads = 4,
                                                          .head_dim = 4,
                                                          .intermediate = 24,
                                                          .vocab = 48,
                                                          .max_positions = 64});
}

}  // namespace

TEST_CASE("context_parallel::CP trains as one process with DDP") {
  const int world = test_world().size();
  for (const auto& model : {tiny_llama(), tiny_neox(), llama_8_heads()}) {
    CAPTURE(model.name);
    for (int c : {2, 4, 8}) {
      if (world % c != 0) continue;
      CAPTURE(c);
      check_equal(model, run_context_parallel(model, c, 1), run_alone(model, world / c, 2));
    }
  }
  report("context parallelism");
}

TEST_CASE("context_parallel::CP with tensor parallelism inside and sharded data parallelism") {
  const int world = test_world().size();
  if (world % 4 != 0) return;  // c = 2 × t = 2
  const auto model = llama_8_heads();
  const auto alone = run_alone(model, world / 4, 2);
  check_equal(model, run_context_parallel(model, 2, 2), alone);
  for (const auto& s :
       {Strategy{"zero2", Flavour::deepspeed}, Strategy{"fsdp-full", Flavour::fsdp2}}) {
    CAPTURE(s.name);
    check_equal(model, run_context_parallel(model, 2, 1, s.name, s.flavour),
                run_alone(model, world / 2, 2));
  }
  report("context parallelism with TP or sharded data parallelism");
}

TEST_CASE("context_parallel::full recompute runs the ring again, same results") {
  const int world = test_world().size();
  if (world % 2 != 0) return;
  const auto model = tiny_llama();
  check_equal(model,
              run_context_parallel(model, 2, 1, "ddp", Flavour::ddp, 2, documents::Precision::fp32,
                                   Checkpointing::full),
              run_alone(model, world / 2, 2));
  report("context parallelism with full recompute");
}

TEST_CASE("context_parallel::under bf16-mixed, CP trains as DDP within bf16's rounding") {
  // test_engine_mpi.cpp's bf16-mixed bounds (derived there): losses within 1e-2 relative,
  // parameters within 2e-2 relative L2. The running output is kept in fp32 between the ring's
  // blocks; dK and dV are rounded to bf16 once per block as they travel.
  const int world = test_world().size();
  if (world % 2 != 0) return;
  const auto bf16 = documents::Precision::bf16_mixed;
  const auto model = tiny_llama();
  const auto alone = run_alone(model, world / 2, 2, bf16);
  const auto run = run_context_parallel(model, 2, 1, "ddp", Flavour::ddp, 2, bf16);
  for (std::size_t k = 0; k < run.losses.size(); ++k)
    CHECK(run.losses[k] == doctest::Approx(alone.losses[k]).epsilon(1e-2));
  CHECK(relative_l2(run.params, alone.params) < 2e-2);
}

TEST_CASE("context_parallel::learned positions and eager attention are refused") {
  if (test_world().size() % 2 != 0) return;
  auto groups = make_context_parallel_groups(test_world(), 2, 1);
  TrackedAllocator allocator;
  ModelOptions options;
  options.context_parallel = {groups.context.get()};
  options.flash_attention = true;
  CHECK_THROWS_AS(GptModel<float>(tiny_gpt2(), allocator, options), std::invalid_argument);
  options.flash_attention = false;
  CHECK_THROWS_AS(GptModel<float>(tiny_llama(), allocator, options), std::invalid_argument);
}
