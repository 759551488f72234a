// Context parallelism (executor/context_parallel.hpp) under mpirun: c ranks sharing every
// sequence (ring attention), times d = world / (c·t) data-parallel replicas, with and without
// tensor parallelism inside (t), train as one process does with DDP on the same global batch;
// and each rank's measured peak against the step walk's prediction for the layout.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "costmodel/parallel_step.hpp"
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
                           Checkpointing checkpointing = Checkpointing::none,
                           bool sequence_parallel = false) {
  auto o = cp_options(model, c, t, strategy, flavour, grad_accumulation, precision, checkpointing);
  auto cp_groups = make_context_parallel_groups(test_world(), c, t);
  TensorParallelGroups tp_groups;
  if (t > 1) {
    tp_groups = make_tensor_parallel_groups(test_world(), t);
    o.model_options.tensor_parallel = {tp_groups.tp.get(), sequence_parallel,
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

TEST_CASE("context_parallel::CP with tensor parallelism inside and sharded data parallelism" *
          doctest::test_suite("a multiple of four ranks")) {
  const int world = test_world().size();
  REQUIRE_MESSAGE(world % 4 == 0, "c = 2 x t = 2: its suite runs on 4 and 8 ranks");
  const auto model = llama_8_heads();
  const auto alone = run_alone(model, world / 4, 2);
  for (bool sp : {false, true}) {
    CAPTURE(sp);
    check_equal(model,
                run_context_parallel(model, 2, 2, "ddp", Flavour::ddp, 2,
                                     documents::Precision::fp32, Checkpointing::none, sp),
                alone);
  }
  for (const auto& s :
       {Strategy{"zero2", Flavour::deepspeed}, Strategy{"fsdp-full", Flavour::fsdp2}}) {
    CAPTURE(s.name);
    check_equal(model, run_context_parallel(model, 2, 1, s.name, s.flavour),
                run_alone(model, world / 2, 2));
  }
  report("context parallelism with TP or sharded data parallelism");
}

TEST_CASE("context_parallel::full recompute runs the ring again, same results" *
          doctest::test_suite("an even number of ranks")) {
  const int world = test_world().size();
  REQUIRE_MESSAGE(world % 2 == 0, "t or c = 2: its suite runs on even rank counts");
  const auto model = tiny_llama();
  check_equal(model,
              run_context_parallel(model, 2, 1, "ddp", Flavour::ddp, 2, documents::Precision::fp32,
                                   Checkpointing::full),
              run_alone(model, world / 2, 2));
  report("context parallelism with full recompute");
}

TEST_CASE("context_parallel::under bf16-mixed, CP trains as DDP within bf16's rounding" *
          doctest::test_suite("an even number of ranks")) {
  // test_engine_mpi.cpp's bf16-mixed bounds (derived there): losses within 1e-2 relative,
  // parameters within 2e-2 relative L2. The running output is kept in fp32 between the ring's
  // blocks; dK and dV are rounded to bf16 once per block as they travel.
  const int world = test_world().size();
  REQUIRE_MESSAGE(world % 2 == 0, "t or c = 2: its suite runs on even rank counts");
  const auto bf16 = documents::Precision::bf16_mixed;
  const auto model = tiny_llama();
  const auto alone = run_alone(model, world / 2, 2, bf16);
  const auto run = run_context_parallel(model, 2, 1, "ddp", Flavour::ddp, 2, bf16);
  for (std::size_t k = 0; k < run.losses.size(); ++k)
    CHECK(run.losses[k] == doctest::Approx(alone.losses[k]).epsilon(1e-2));
  CHECK(relative_l2(run.params, alone.params) < 2e-2);
}

TEST_CASE("context_parallel::learned positions and eager attention are refused" *
          doctest::test_suite("an even number of ranks")) {
  REQUIRE_MESSAGE(test_world().size() % 2 == 0, "t or c = 2: its suite runs on even rank counts");
  auto groups = make_context_parallel_groups(test_world(), 2, 1);
  TrackedAllocator allocator;
  ModelOptions options;
  options.context_parallel = {groups.context.get()};
  options.flash_attention = true;
  CHECK_THROWS_AS(GptModel<float>(tiny_gpt2(), allocator, options), std::invalid_argument);
  options.flash_attention = false;
  CHECK_THROWS_AS(GptModel<float>(tiny_llama(), allocator, options), std::invalid_argument);
}

namespace {

// Llama-like, as test_tensor_parallel_mpi.cpp's memory test: 4 blocks, h = 64, q = 64 (4 heads of
// 16), kv = 32, I = 128 (SwiGLU), V = 64, untied.
documents::ModelSpec memory_llama() {
  return scale_down(documents::load_model("llama-3-8b"), {.layers = 4,
                                                          .hidden = 64,
                                                          .heads = 4,
                                                          .kv_heads = 2,
                                                          .head_dim = 16,
                                                          .intermediate = 128,
                                                          .vocab = 64,
                                                          .max_positions = 128});
}

// Full multi-head attention (kv = q = 64) over a narrow MLP (I = 16) and a vocabulary of 16: the
// ring's moment in a block's backward is the stage's largest (derived in the test below).
documents::ModelSpec ring_heavy_llama() {
  return scale_down(documents::load_model("llama-3-8b"), {.layers = 4,
                                                          .hidden = 64,
                                                          .heads = 4,
                                                          .kv_heads = 4,
                                                          .head_dim = 16,
                                                          .intermediate = 16,
                                                          .vocab = 16,
                                                          .max_positions = 128});
}

// One step of c-way context parallelism (DDP over the d·c ranks, micro-batch 2 × 64 tokens,
// fp32, flash attention) beside the step walk's prediction for the layout, as `planner validate`
// asks for it.
costmodel::StepResult predict_step(const documents::ModelSpec& model, int c, int world,
                                   const documents::HardwareProfile& hw) {
  costmodel::StepInput in;
  in.model = &model;
  in.hardware = &hw;
  in.cluster = {world, world};
  in.job.seq_len = 64;
  in.job.micro_batch = 2;
  in.job.global_batch = 2 * world / c;
  in.job.precision = documents::Precision::fp32;
  in.job.checkpointing = documents::Checkpointing::none;
  in.job.attention = documents::AttentionImpl::flash;
  in.job.recipe = documents::Recipe::executor;
  in.spec = documents::make_spec("ddp", documents::Flavour::ddp, world);
  documents::ParallelLayout layout;
  layout.context_parallel = c;
  return costmodel::simulate_parallel_step(in, layout).step;
}

}  // namespace

TEST_CASE("context_parallel::measured memory against the cost model's prediction") {
  // Hand derivation for c = 2 (N = 2 × 64 / 2 = 64 tokens per rank, 4 bytes per element), what
  // executor/gpt_model.cpp and context_parallel_block.cpp allocate and the step walk predicts:
  //   elements E: embedding V·h = 4,096; per block 2h + qh + 2·kv·h + qh + 3·I·h = 36,992, ×4 =
  //     147,968; head h + V·h = 4,160; E = 156,224. Parameters 4E, AdamW 8E, DDP's bucket copy 4E.
  //   saved per block: input, norm1, mid, norm2 4·4Nh = 65,536; q, k, v, attn_out 4N(2q + 2kv) =
  //     49,152; gate, up, act 3·4N·I = 98,304; lse 4·a·N = 1,024; two rstd 2·4N = 512: 214,528
  //   the ring's moment in a block's backward (dy 4Nh + d_attn_out, dq 2·4Nq + dk, dv and three
  //     ring buffers 5·4N·kv + delta 4aN − the MLP's 3·4NI − mid, norm2 2·4Nh − rstd 4N) is
  //     16,384 + 32,768 + 40,960 + 1,024 − 98,304 − 32,768 − 256 < 0: the MLP's moment (dy, d_in
  //     2·4Nh + d_pre, d_up 2·4NI = 98,304) stays the block's largest, as without CP; the ring
  //     shows in the peak only through N = s·b/c.
  // So the stage's accounting is the TP test's with N halved and t = 1.
  // ring_heavy_llama (q = kv = h = 64, I = 16, V = 16): E = V·h 1,024 + 4 × (2h + 2qh + 2·kv·h
  //   + 3·I·h = 19,584) + h + V·h 1,088 = 80,448. Per token (4 bytes per element): the ring's
  //   moment adds dy 4h + d_attn_out, dq 8q + dk, dv and the ring's three 20·kv + delta 4a
  //   − the MLP's 12·I − mid, norm2 8h − rstd 4 = 256 + 512 + 1,280 + 16 − 192 − 512 − 4 =
  //   1,356 bytes beyond the saved tensors, the MLP's moment 8h + 8I = 640, the head's (its
  //   logits' two gradients 8·V = 128 beside what it keeps, 8h + 4 + 8V = 644) 772: the ring's
  //   is the peak, and the prediction must count it to match.
  // The test holds the measured peak and its categories to the prediction exactly.
  const int world = test_world().size();
  const auto hw = cpu_profile(world);
  struct Case {
    documents::ModelSpec model;
    double elements;  // E, derived above
  };
  for (const auto& k : {Case{memory_llama(), 156224}, Case{ring_heavy_llama(), 80448}})
    for (int c : {2, 4}) {
      if (world % c != 0) continue;
      const auto& model = k.model;
      const double E = k.elements;
      CAPTURE(c);
      CAPTURE(model.name);
      auto o = cp_options(model, c, 1, "ddp", Flavour::ddp, 1, documents::Precision::fp32,
                          Checkpointing::none);
      o.micro_batch = {2, 64 / c};
      auto groups = make_context_parallel_groups(test_world(), c, 1);
      o.model_options.context_parallel = {groups.context.get()};
      auto owned = make_groups(*groups.data, o.spec);
      const auto run = run_engine(o, owned.groups, 1, false);
      const auto step = predict_step(model, c, world, hw);
      REQUIRE(step.valid);
      const auto predicted = [&](documents::Category category) {
        return step.at_peak[static_cast<int>(category)];
      };
      CHECK(run.at_peak[MemoryCategory::parameters] == 4 * E);
      CHECK(predicted(documents::Category::parameters) == 4 * E);
      CHECK(run.at_peak[MemoryCategory::optimizer_states] ==
            predicted(documents::Category::optimizer_states));
      CHECK(run.at_peak[MemoryCategory::buffers] == predicted(documents::Category::buffers));
      CHECK(run.at_peak[MemoryCategory::gradients] == predicted(documents::Category::gradients));
      CHECK(run.at_peak[MemoryCategory::activations] ==
            predicted(documents::Category::activations));
      const double error = static_cast<double>(run.peak_bytes) / step.peak_bytes - 1;
      CHECK(std::abs(error) <= 0.03);
      if (test_world().rank() == 0)
        MESSAGE("c=" << c << ": measured peak " << run.peak_bytes << " B, predicted "
                     << step.peak_bytes << " B (error " << error << "); activations "
                     << run.at_peak[MemoryCategory::activations] << " (predicted "
                     << predicted(documents::Category::activations) << ")");
    }
}
