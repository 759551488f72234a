// Tensor parallelism (executor/tensor_parallel.hpp) under mpirun: t ranks of a TP group times
// d = world / t data-parallel replicas train as one process does with DDP on the same global
// batch, with and without sequence parallelism, for the Llama, GPT-2 and GPT-NeoX families.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "costmodel/parallel_memory.hpp"
#include "costmodel/pipeline_schedule.hpp"
#include "engine_fixture.hpp"
#include "executor/tensor_parallel.hpp"
#include "mpi_test_world.hpp"

using namespace shardplan;
using namespace shardplan::executor;
using namespace shardplan::kernels;
using namespace shardplan::executor::testing;
using documents::Flavour;

namespace {

// Tolerances, fp32. Tensor parallelism computes the same sums as one process in a different
// order: a row-parallel output is the sum of t partial products over in/t columns each, added in
// the all-reduce's (or reduce-scatter's) order, and the data-parallel gradients are summed over d
// replicas as in the DDP tests. Each reordered fp32 sum differs by a few units of roundoff
// (2^-24 ≈ 6e-8) relative, so activations and gradients agree to ~1e-7–1e-6 relative after the
// two blocks. The loss is a mean of ~16–64 terms of size ~log 50 ≈ 3.9: bound 1e-6 relative,
// as test_engine_mpi.cpp's. AdamW's update is lr · m̂/(√v̂ + ε): a gradient's relative error ε_g
// moves an update by ~ε_g · lr (lr = 1e-2), i.e. ~1e-8 per step, except where a gradient is at
// the roundoff level of its own sum; the parameters agree to 2e-5 absolute, the bound of the
// sharded strategies' test, while a missing reduction or a wrong slice moves them by ~lr = 1e-2.
constexpr double kLossTolerance = 1e-6;
constexpr double kParamTolerance = 2e-5;
constexpr int kSteps = 2;

// Llama-like with 8 query heads over 4 key/value heads, so that t = 4 keeps GQA (2 query heads
// per rank over 1 key/value head).
documents::ModelSpec tiny_llama_8_heads() {
  return scale_down(documents::load_model("llama-3-8b"), {.layers = 2,
                                                          .hidden = 16,
                                                          .heads = 8,
                                                          .kv_heads = 4,
                                                          .head_dim = 4,
                                                          .intermediate = 24,
                                                          .vocab = 50,
                                                          .max_positions = 64});
}

bool divides(const documents::ModelSpec& m, int t) {
  return m.heads % t == 0 && m.kv_heads % t == 0 && m.intermediate % t == 0;
}

struct TpRun {
  std::vector<double> losses;
  std::vector<std::vector<float>> params;  // per unit, the full model's
  std::int64_t peak_bytes = 0;
};

// t-way tensor parallelism with `strategy` over the d = world / t replicas.
TpRun run_tensor_parallel(const documents::ModelSpec& full, int t, bool sequence_parallel,
                          const char* strategy, Flavour flavour, std::int64_t grad_accumulation,
                          documents::Precision precision = documents::Precision::fp32,
                          Checkpointing checkpointing = Checkpointing::none,
                          bool flash_attention = false) {
  auto tp_groups = make_tensor_parallel_groups(test_world(), t);
  const int d = test_world().size() / t;
  auto o = test_options(local_spec(full, t), test_spec(strategy, flavour, d), grad_accumulation,
                        checkpointing);
  o.precision = precision;
  o.model_options.flash_attention = flash_attention;
  o.model_options.tensor_parallel = {tp_groups.tp.get(), sequence_parallel,
                                     std::make_shared<const GptLayout>(full)};
  auto owned = make_groups(*tp_groups.dp, o.spec);
  TpRun r;
  TrackedAllocator allocator;
  {
    ShardingEngine engine(o, allocator, owned.groups);
    for (int k = 0; k < kSteps; ++k) r.losses.push_back(engine.step().loss);
    for (std::int64_t u = 0; u < engine.layout().unit_count(); ++u)
      r.params.push_back(gather_full_unit(o.model_options.tensor_parallel, engine.layout(), u,
                                          engine.full_parameters(u)));
  }
  r.peak_bytes = allocator.peak_bytes();
  return r;
}

// DDP in one process over the same global batch: d × grad_accumulation micro-batches.
TpRun run_alone(const documents::ModelSpec& full, int d, std::int64_t grad_accumulation,
                documents::Precision precision = documents::Precision::fp32,
                bool flash_attention = false) {
  auto self = test_world().split(test_world().rank(), 0);
  auto o = test_options(full, test_spec("ddp", Flavour::ddp, 1), grad_accumulation * d);
  o.precision = precision;
  o.model_options.flash_attention = flash_attention;
  const auto run = run_engine(o, {self.get(), self.get(), nullptr, false}, kSteps);
  return {run.losses, run.params, run.peak_bytes};
}

double worst_loss = 0, worst_param = 0;  // over every comparison, for the log

void check_equal(const TpRun& a, const TpRun& alone) {
  REQUIRE(a.losses.size() == alone.losses.size());
  REQUIRE(a.params.size() == alone.params.size());
  for (std::size_t k = 0; k < a.losses.size(); ++k) {
    CHECK(a.losses[k] == doctest::Approx(alone.losses[k]).epsilon(kLossTolerance));
    worst_loss = std::max(worst_loss, std::abs(a.losses[k] / alone.losses[k] - 1));
  }
  for (std::size_t u = 0; u < a.params.size(); ++u)
    REQUIRE(a.params[u].size() == alone.params[u].size());
  const double diff = max_abs_difference(a.params, alone.params);
  worst_param = std::max(worst_param, diff);
  CHECK(diff < kParamTolerance);
}

}  // namespace

TEST_CASE("tensor_parallel::TP and TP+SP train as one process with DDP") {
  const int world = test_world().size();
  for (const auto& model : {tiny_llama(), tiny_llama_8_heads(), tiny_gpt2(), tiny_neox()}) {
    CAPTURE(model.name);
    for (int t : {2, 4}) {
      if (world % t != 0 || !divides(model, t)) continue;
      CAPTURE(t);
      const int d = world / t;
      const auto alone = run_alone(model, d, 2);
      for (bool sp : {false, true}) {
        CAPTURE(sp);
        check_equal(run_tensor_parallel(model, t, sp, "ddp", Flavour::ddp, 2), alone);
      }
    }
  }
  if (test_world().rank() == 0)
    MESSAGE(world << " ranks, tensor parallel: worst relative loss difference " << worst_loss
                  << ", worst parameter difference " << worst_param);
}

TEST_CASE("tensor_parallel::TP with sharded data parallelism over the replicas") {
  const int world = test_world().size();
  if (world < 4) return;  // d = 2 replicas of t = 2
  const auto model = tiny_llama();
  const auto alone = run_alone(model, world / 2, 2);
  for (const auto& s :
       {Strategy{"zero2", Flavour::deepspeed}, Strategy{"fsdp-full", Flavour::fsdp2}}) {
    CAPTURE(s.name);
    for (bool sp : {false, true}) {
      CAPTURE(sp);
      check_equal(run_tensor_parallel(model, 2, sp, s.name, s.flavour, 2), alone);
    }
  }
}

TEST_CASE("tensor_parallel::full recompute runs the block's collectives again, same results") {
  const int world = test_world().size();
  if (world % 2 != 0) return;
  for (const auto& model : {tiny_llama(), tiny_gpt2()}) {
    CAPTURE(model.name);
    const auto alone = run_alone(model, world / 2, 2);
    for (bool sp : {false, true}) {
      CAPTURE(sp);
      check_equal(run_tensor_parallel(model, 2, sp, "ddp", Flavour::ddp, 2,
                                      documents::Precision::fp32, Checkpointing::full),
                  alone);
    }
  }
}

TEST_CASE("tensor_parallel::flash attention over the local heads") {
  const int world = test_world().size();
  if (world % 2 != 0) return;
  for (const auto& model : {tiny_llama(), tiny_neox()}) {
    CAPTURE(model.name);
    const auto alone = run_alone(model, world / 2, 2, documents::Precision::fp32, true);
    for (bool sp : {false, true}) {
      CAPTURE(sp);
      check_equal(run_tensor_parallel(model, 2, sp, "ddp", Flavour::ddp, 2,
                                      documents::Precision::fp32, Checkpointing::none, true),
                  alone);
    }
  }
}

TEST_CASE("tensor_parallel::under bf16-mixed, TP trains as DDP within bf16's rounding") {
  // The bounds of test_engine_mpi.cpp's bf16-mixed case (derived there): losses within 1e-2
  // relative, parameters within 2e-2 relative L2; TP's partial sums are bf16 tensors reduced in
  // bf16 (Megatron all-reduces the row-parallel outputs in the activation dtype).
  const int world = test_world().size();
  if (world % 2 != 0) return;
  const auto bf16 = documents::Precision::bf16_mixed;
  const auto model = tiny_llama();
  const auto alone = run_alone(model, world / 2, 2, bf16);
  for (bool sp : {false, true}) {
    CAPTURE(sp);
    const auto run = run_tensor_parallel(model, 2, sp, "ddp", Flavour::ddp, 2, bf16);
    for (std::size_t k = 0; k < run.losses.size(); ++k)
      CHECK(run.losses[k] == doctest::Approx(alone.losses[k]).epsilon(1e-2));
    CHECK(relative_l2(run.params, alone.params) < 2e-2);
  }
}

TEST_CASE("tensor_parallel::sequence parallelism keeps less per rank") {
  const int world = test_world().size();
  if (world % 2 != 0) return;
  // The same model and batch: SP shards the residual stream, the norms' outputs and the saved
  // block inputs over t, so the peak is lower than TP's alone.
  const auto model = tiny_llama();
  const auto tp = run_tensor_parallel(model, 2, false, "ddp", Flavour::ddp, 1);
  const auto sp = run_tensor_parallel(model, 2, true, "ddp", Flavour::ddp, 1);
  CHECK(sp.peak_bytes < tp.peak_bytes);
}

namespace {

// One t = 2 step (DDP over the replicas, one micro-batch, fp32, eager attention): the executor's
// per-rank memory beside costmodel/parallel_memory's stage prediction for the same layout (p = 1).
EngineRun run_for_memory(const documents::ModelSpec& model, int t, bool sp, int d) {
  auto tp_groups = make_tensor_parallel_groups(test_world(), t);
  EngineOptions o;
  o.model = local_spec(model, t);
  o.spec = documents::make_spec("ddp", documents::Flavour::ddp, d);
  o.micro_batch = {2, 32};
  o.model_options.tensor_parallel = {tp_groups.tp.get(), sp,
                                     std::make_shared<const GptLayout>(model)};
  auto owned = make_groups(*tp_groups.dp, o.spec);
  return run_engine(o, owned.groups, 1, false);
}

costmodel::StageMemory predict_stage(const documents::ModelSpec& model, int t, bool sp, int world,
                                     const documents::HardwareProfile& hw) {
  costmodel::ParallelMemoryInput in;
  in.model = &model;
  in.hardware = &hw;
  in.cluster = {world, world};
  in.job.seq_len = 32;
  in.job.micro_batch = 2;
  in.job.global_batch = 2 * world / t;
  in.job.precision = documents::Precision::fp32;
  in.job.checkpointing = documents::Checkpointing::none;
  in.job.attention = documents::AttentionImpl::eager;
  in.job.recipe = documents::Recipe::executor;
  in.spec = documents::make_spec("ddp", documents::Flavour::ddp, world / t);
  in.layout.tensor_parallel = t;
  in.layout.sequence_parallel = sp;
  const auto walk =
      costmodel::walk_schedule(costmodel::PipelineSchedule::one_f_one_b, 1, 1, 1, {1.0}, {2.0});
  return costmodel::parallel_memory(in, walk).stages.at(0);
}

}  // namespace

TEST_CASE("tensor_parallel::measured memory against the cost model's per-stage prediction") {
  // The cost model counts Megatron-core's GPT: a vocabulary-parallel embedding and head (1/t of
  // the token table, the output matrix and the logits). The executor replicates them, so the
  // prediction is put on the executor's layout by counting those two units whole:
  //   states      elements E = the stage's local_params − tp_local_elements(embedding, head; t)
  //                            + tp_local_elements(embedding, head; 1); fp32 AdamW under DDP:
  //                            parameters 4·E bytes, moments 8·E (costmodel::state_bytes)
  //   activations + (1 − 1/t)·(4·N·V saved fp32 softmax + 4·N·V transient logits), the two
  //                 vocabulary terms of parallel_memory.cpp's head_saved and transient
  // Parameters and moments must then agree exactly; the activations at the executor's peak within
  // 3% (it also keeps each norm's fp32 rstd, 4 bytes per token of its shard). The activations'
  // own peak, in the head's backward, is higher by the two [N, V] fp32 gradients of the
  // log-probabilities and the logits, which the per-stage model's transient leaves out.
  // Gradients and buffers are reported, not compared: the executor allocates DDP's whole
  // gradients at their first use and keeps torch DDP's bucket copy (grad_bucket_copy), which the
  // per-stage model does not walk.
  const int world = test_world().size();
  if (world % 2 != 0) return;
  const int t = 2, d = world / t;
  const auto model = scale_down(documents::load_model("llama-3-8b"), {.layers = 4,
                                                                      .hidden = 64,
                                                                      .heads = 4,
                                                                      .kv_heads = 2,
                                                                      .head_dim = 16,
                                                                      .intermediate = 128,
                                                                      .vocab = 64,
                                                                      .max_positions = 64});
  const auto hw = cpu_profile(world);
  for (bool sp : {false, true}) {
    CAPTURE(sp);
    const auto run = run_for_memory(model, t, sp, d);
    const auto stage = predict_stage(model, t, sp, world, hw);
    using costmodel::tp_local_elements;
    const double E = stage.local_params - tp_local_elements(model.embedding, t, true) -
                     tp_local_elements(model.head, t, false) +
                     tp_local_elements(model.embedding, 1, true) +
                     tp_local_elements(model.head, 1, false);
    const double NV = 2.0 * 32 * static_cast<double>(model.vocab);
    const double activations = stage.activation_bytes + (1 - 1.0 / t) * 8 * NV;
    const auto measured = [&](MemoryCategory c) {
      return static_cast<double>(run.category_peaks[c]);
    };
    CHECK(measured(MemoryCategory::parameters) == 4 * E);
    CHECK(measured(MemoryCategory::optimizer_states) == 8 * E);
    const double at_peak = static_cast<double>(run.at_peak[MemoryCategory::activations]);
    const double ratio = at_peak / activations;
    CHECK(std::abs(ratio - 1) < 0.03);
    if (test_world().rank() == 0)
      MESSAGE(std::string(sp ? "t=2+SP" : "t=2")
              << " d=" << d << ": measured peak " << run.peak_bytes
              << " B; parallel_memory stage 0 " << stage.total() << " B (parameters "
              << stage.param_bytes << ", gradients " << stage.grad_bytes << ", optimizer "
              << stage.optimizer_bytes << ", buffers " << stage.buffer_bytes << ", activations "
              << stage.activation_bytes << "); on the replicated layout: parameters " << 4 * E
              << ", optimizer " << 8 * E << ", activations " << activations
              << "; measured category peaks: parameters " << measured(MemoryCategory::parameters)
              << ", gradients " << measured(MemoryCategory::gradients) << ", optimizer "
              << measured(MemoryCategory::optimizer_states) << ", activations "
              << measured(MemoryCategory::activations) << " (at the total's peak " << at_peak
              << ", ratio " << ratio << "), buffers " << measured(MemoryCategory::buffers));
  }
}
