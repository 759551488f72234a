// Tensor parallelism (executor/tensor_parallel.hpp) under mpirun: t ranks of a TP group times
// d = world / t data-parallel replicas train as one process does with DDP on the same global
// batch, with and without sequence parallelism, for the Llama, GPT-2 and GPT-NeoX families.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "costmodel/parallel_step.hpp"
#include "engine_fixture.hpp"
#include "executor/tensor_parallel.hpp"
#include "mpi_test_world.hpp"
#include "update_comparison.hpp"

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
// as test_engine_mpi.cpp's (measured: < 2e-8 on 2–8 ranks). The parameters are compared through
// their updates, per tensor, within update_comparison.hpp's bound (2e-3 relative L2, derived
// there for d·t ≤ 8). Measured, worst over the comparisons of a run (mpirun -np N
// executor_mpi_tests, printed by rank 0), relative L2 of the update difference and largest
// absolute parameter difference:
//   ranks            2        4        6        8
//   t = 2      rel   1.4e-5   1.6e-5   3.6e-5   8.0e-5
//              abs   2.0e-6   3.2e-6   2.4e-6   2.3e-5
//   t = 4      rel            7.3e-6            1.4e-5
//              abs            1.9e-6            4.3e-6
// The worst relative on 8 ranks is the Llama's block-1 up projection at t = 2, d = 4; there the
// largest absolute difference (2.3e-5, beyond the 2e-5 absolute bound this replaces) is an
// element whose gradients were +8.3e-6 and then -9.8e-6 (from the reference's moments): its
// step-2 gradient differs between the runs by ≈ 4e-8, 4e-3 relative, a sum near cancellation.
// A missing reduction or a wrong slice moves whole tensors' updates by ~lr = 1e-2: relative
// differences of order 0.1–1.
constexpr double kLossTolerance = 1e-6;
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
                                                          .vocab = 48,
                                                          .max_positions = 64});
}

// The fixture's GPT-2 and GPT-NeoX with a vocabulary of 48 instead of 50: a multiple of t = 2
// and 4 (the embedding and the head are vocabulary-parallel; tensor_parallel.hpp); GPT-2 with 32
// learned positions, for the memory test's sequences of 32.
documents::ModelSpec tiny_gpt2_48() {
  return scale_down(documents::load_model("gpt2"), {.layers = 2,
                                                    .hidden = 16,
                                                    .heads = 4,
                                                    .intermediate = 32,
                                                    .vocab = 48,
                                                    .max_positions = 32});
}
documents::ModelSpec tiny_neox_48() {
  const nlohmann::json config = {{"architectures", {"GPTNeoXForCausalLM"}},
                                 {"hidden_size", 16},
                                 {"intermediate_size", 32},
                                 {"num_hidden_layers", 2},
                                 {"num_attention_heads", 4},
                                 {"vocab_size", 48},
                                 {"max_position_embeddings", 64}};
  return documents::model_from_hf_config(config, "tiny-neox");
}

bool divides(const documents::ModelSpec& m, int t) {
  return m.heads % t == 0 && m.kv_heads % t == 0 && m.intermediate % t == 0 && m.vocab % t == 0;
}

struct TpRun {
  std::vector<double> losses;
  std::vector<std::vector<float>> params;  // per unit, the full model's
  std::int64_t peak_bytes = 0;
  std::vector<std::vector<float>> initial;  // run_alone's: the parameters before the first step
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
  const auto initial = run_engine(o, {self.get(), self.get(), nullptr, false}, 0);
  return {run.losses, run.params, run.peak_bytes, initial.params};
}

// Over every comparison, for the log.
WorstSeen worst_seen;  // over the comparisons since the last report

// `full`: the model both runs train, whole (run_alone's).
void check_equal(const documents::ModelSpec& full, const TpRun& a, const TpRun& alone) {
  REQUIRE(a.losses.size() == alone.losses.size());
  REQUIRE(a.params.size() == alone.params.size());
  for (std::size_t k = 0; k < a.losses.size(); ++k) {
    CHECK(a.losses[k] == doctest::Approx(alone.losses[k]).epsilon(kLossTolerance));
    worst_seen.loss = std::max(worst_seen.loss, std::abs(a.losses[k] / alone.losses[k] - 1));
  }
  for (std::size_t u = 0; u < a.params.size(); ++u)
    REQUIRE(a.params[u].size() == alone.params[u].size());
  const auto diffs = compare_updates(GptLayout(full), alone.initial, a.params, alone.params);
  worst_seen.check(diffs);
}

void report(const std::string& what) {
  if (test_world().rank() == 0)
    MESSAGE(test_world().size() << " ranks, " << what << ": " << worst_seen.text());
  worst_seen = {};
}

}  // namespace

TEST_CASE("tensor_parallel::TP and TP+SP train as one process with DDP") {
  const int world = test_world().size();
  for (const auto& model : {tiny_llama(), tiny_llama_8_heads(), tiny_gpt2_48(), tiny_neox_48()}) {
    CAPTURE(model.name);
    for (int t : {2, 4}) {
      if (world % t != 0 || !divides(model, t)) continue;
      CAPTURE(t);
      const int d = world / t;
      const auto alone = run_alone(model, d, 2);
      for (bool sp : {false, true}) {
        CAPTURE(sp);
        check_equal(model, run_tensor_parallel(model, t, sp, "ddp", Flavour::ddp, 2), alone);
      }
    }
  }
  report("TP and TP+SP");
}

TEST_CASE("tensor_parallel::TP with sharded data parallelism over the replicas" *
          doctest::test_suite("an even number of ranks from four")) {
  const int world = test_world().size();
  REQUIRE_MESSAGE((world >= 4 && world % 2 == 0),
                  "d >= 2 replicas of t = 2: its suite runs on 4, 6 and 8 ranks");
  const auto model = tiny_llama();
  const auto alone = run_alone(model, world / 2, 2);
  for (const auto& s :
       {Strategy{"zero2", Flavour::deepspeed}, Strategy{"fsdp-full", Flavour::fsdp2}}) {
    CAPTURE(s.name);
    for (bool sp : {false, true}) {
      CAPTURE(sp);
      check_equal(model, run_tensor_parallel(model, 2, sp, s.name, s.flavour, 2), alone);
    }
  }
  report("TP with sharded data parallelism");
}

TEST_CASE("tensor_parallel::full recompute runs the block's collectives again, same results" *
          doctest::test_suite("an even number of ranks")) {
  const int world = test_world().size();
  REQUIRE_MESSAGE(world % 2 == 0, "t or c = 2: its suite runs on even rank counts");
  for (const auto& model : {tiny_llama(), tiny_gpt2()}) {
    CAPTURE(model.name);
    const auto alone = run_alone(model, world / 2, 2);
    for (bool sp : {false, true}) {
      CAPTURE(sp);
      check_equal(model,
                  run_tensor_parallel(model, 2, sp, "ddp", Flavour::ddp, 2,
                                      documents::Precision::fp32, Checkpointing::full),
                  alone);
    }
  }
  report("TP with full recompute");
}

TEST_CASE("tensor_parallel::flash attention over the local heads" *
          doctest::test_suite("an even number of ranks")) {
  const int world = test_world().size();
  REQUIRE_MESSAGE(world % 2 == 0, "t or c = 2: its suite runs on even rank counts");
  for (const auto& model : {tiny_llama(), tiny_neox()}) {
    CAPTURE(model.name);
    const auto alone = run_alone(model, world / 2, 2, documents::Precision::fp32, true);
    for (bool sp : {false, true}) {
      CAPTURE(sp);
      check_equal(model,
                  run_tensor_parallel(model, 2, sp, "ddp", Flavour::ddp, 2,
                                      documents::Precision::fp32, Checkpointing::none, true),
                  alone);
    }
  }
  report("TP with flash attention");
}

TEST_CASE("tensor_parallel::under bf16-mixed, TP trains as DDP within bf16's rounding" *
          doctest::test_suite("an even number of ranks")) {
  // The bounds of test_engine_mpi.cpp's bf16-mixed case (derived there): losses within 1e-2
  // relative, parameters within 2e-2 relative L2; TP's partial sums are bf16 tensors reduced in
  // bf16 (Megatron all-reduces the row-parallel outputs in the activation dtype).
  const int world = test_world().size();
  REQUIRE_MESSAGE(world % 2 == 0, "t or c = 2: its suite runs on even rank counts");
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

TEST_CASE("tensor_parallel::sequence parallelism keeps less per rank" *
          doctest::test_suite("an even number of ranks")) {
  const int world = test_world().size();
  REQUIRE_MESSAGE(world % 2 == 0, "t or c = 2: its suite runs on even rank counts");
  // The same model and batch: SP shards the residual stream, the norms' outputs and the saved
  // block inputs over t, so the peak is lower than TP's alone.
  const auto model = tiny_llama();
  const auto tp = run_tensor_parallel(model, 2, false, "ddp", Flavour::ddp, 1);
  const auto sp = run_tensor_parallel(model, 2, true, "ddp", Flavour::ddp, 1);
  CHECK(sp.peak_bytes < tp.peak_bytes);
}

namespace {

// One t = 2 step (DDP over the replicas, one micro-batch, fp32, eager attention): the executor's
// per-rank memory beside the step walk's prediction for the same layout (p = 1).
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

// The step walk's prediction for the same layout, as `planner validate` asks for it.
costmodel::StepResult predict_step(const documents::ModelSpec& model, int t, bool sp, int world,
                                   const documents::HardwareProfile& hw) {
  costmodel::StepInput in;
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
  documents::ParallelLayout layout;
  layout.tensor_parallel = t;
  layout.sequence_parallel = sp;
  return costmodel::simulate_parallel_step(in, layout).step;
}

}  // namespace

TEST_CASE("tensor_parallel::measured memory against the cost model's per-stage prediction" *
          doctest::test_suite("an even number of ranks")) {
  // One step at t = 2, DDP over d = world/2 replicas, fp32, eager attention, Llama-like: 4 blocks,
  // h = 64, q = 64 (4 heads of 16), kv = 32 (2 heads), I = 128 (SwiGLU), V = 64 (untied), RMSNorm,
  // no biases; micro-batch B = 2 × T = 32, N = 64 tokens. Hand derivation of what one rank holds
  // (executor/gpt_model.cpp, tensor_parallel_block.cpp, tensor_parallel_vocab.cpp, grad_buffer.cpp)
  // and what the step walk must predict, in bytes (4 per element):
  //   elements E: embedding V/t·h = 2,048; per block 2h norms + (qh + 2kv·h + qh + 3Ih)/t =
  //     128 + 18,432 = 18,560, ×4 = 74,240; head h + V/t·h = 2,112; E = 78,400
  //   parameters 4E = 313,600; AdamW's moments 8E = 627,200; DDP's bucket copy 4E = 313,600
  //   saved per block, n = N (N/t with SP) rows of the residual stream: input, norm1, mid, norm2
  //     4·4nh; q, k, v, attn_out 4N(2q + 2kv)/t = 24,576; gate, up, act 3·4N·I/t = 49,152;
  //     probs 4·B(a/t)T² = 16,384; two rstd 2·4n.  No SP: 65,536 + 24,576 + 49,152 + 16,384 +
  //     512 = 156,160; SP: 32,768 + ... + 256 = 123,136
  //   head: input 4nh + norm_out gathered 4Nh + rstd 4n + logits and log-probs 8N·V/t = 16,384:
  //     no SP 49,408, SP 41,088; tokens and targets 8N = 512
  //   the peak: the last block's MLP backward (dy 4nh, d_in 4Nh (+ the gathered norm2 4Nh with
  //     SP), d_pre and d_up 2·4N·I/t in place of act: 65,536, SP 73,728) with the head's saved
  //     freed and the head's and the last block's gradients allocated (first use: 4·(2,112 +
  //     18,560) = 82,688); the other moments (the head's backward, the first block's, the
  //     embedding's) are lower
  //   activations at the peak: no SP 4·156,160 + 512 + 65,536 = 690,688; SP 4·123,136 + 512 +
  //     73,728 = 566,784
  //   total: no SP 313,600 + 627,200 + 313,600 + 82,688 + 690,688 = 2,027,776;
  //          SP 313,600 + 627,200 + 313,600 + 82,688 + 566,784 = 1,903,872
  // Before the vocabulary-parallel embedding and head (both replicated, E = 82,496) the measured
  // peak was 2,101,504 B against a prediction of 1,926,656 (+9.1%).
  const int world = test_world().size();
  REQUIRE_MESSAGE(world % 2 == 0, "t or c = 2: its suite runs on even rank counts");
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
    const auto step = predict_step(model, t, sp, world, hw);
    REQUIRE(step.valid);
    const auto predicted = [&](documents::Category c) { return step.at_peak[static_cast<int>(c)]; };
    const double E = 78400;
    CHECK(predicted(documents::Category::parameters) == 4 * E);
    CHECK(predicted(documents::Category::optimizer_states) == 8 * E);
    CHECK(predicted(documents::Category::buffers) == 4 * E);
    CHECK(predicted(documents::Category::gradients) == 82688);
    CHECK(predicted(documents::Category::activations) == (sp ? 566784 : 690688));
    CHECK(step.allocated_peak_bytes == (sp ? 1903872 : 2027776));
    const auto at_peak = [&](MemoryCategory c) { return static_cast<double>(run.at_peak[c]); };
    CHECK(at_peak(MemoryCategory::parameters) == 4 * E);
    CHECK(at_peak(MemoryCategory::optimizer_states) == 8 * E);
    CHECK(at_peak(MemoryCategory::buffers) == 4 * E);
    CHECK(at_peak(MemoryCategory::gradients) == predicted(documents::Category::gradients));
    const double error = static_cast<double>(run.peak_bytes) / step.peak_bytes - 1;
    CHECK(std::abs(error) <= 0.03);
    MESSAGE("rank " << test_world().rank() << std::string(sp ? " t=2+SP" : " t=2") << " d=" << d
                    << ": measured peak " << run.peak_bytes << " B, predicted " << step.peak_bytes
                    << " B (error " << error << "); at the peak: activations "
                    << at_peak(MemoryCategory::activations) << " (predicted "
                    << predicted(documents::Category::activations) << "), gradients "
                    << at_peak(MemoryCategory::gradients));
  }
}

TEST_CASE("tensor_parallel::the other families' measured peaks against the prediction" *
          doctest::test_suite("an even number of ranks")) {
  // The accounting derived above for the Llama, on GPT-2 (LayerNorm with biases, GELU, learned
  // positions, tied head: the head's backward is the embedding gradient's first use), GPT-NeoX
  // (parallel residual, fused query_key_value with biases) and a Llama with 8 heads over 4, t = 2,
  // the same step. Measured (mpirun -np 2 executor_mpi_tests): every peak equal to the prediction
  // to the byte, the column-parallel biases split as the executor and Megatron split them
  // (tp_local_elements; counted whole before, GPT-2 was over-predicted by 1,280 B of 183,680).
  const int world = test_world().size();
  REQUIRE_MESSAGE(world % 2 == 0, "t or c = 2: its suite runs on even rank counts");
  const auto hw = cpu_profile(world);
  for (const auto& model : {tiny_gpt2_48(), tiny_neox_48(), tiny_llama_8_heads()}) {
    for (bool sp : {false, true}) {
      CAPTURE(model.name);
      CAPTURE(sp);
      const auto run = run_for_memory(model, 2, sp, world / 2);
      const auto step = predict_step(model, 2, sp, world, hw);
      REQUIRE(step.valid);
      CHECK(run.at_peak[MemoryCategory::gradients] ==
            step.at_peak[static_cast<int>(documents::Category::gradients)]);
      CHECK(run.at_peak[MemoryCategory::activations] ==
            step.at_peak[static_cast<int>(documents::Category::activations)]);
      const double error = static_cast<double>(run.peak_bytes) / step.peak_bytes - 1;
      CHECK(std::abs(error) <= 0.03);
      if (test_world().rank() == 0)
        MESSAGE(model.name << std::string(sp ? ", t=2+SP" : ", t=2") << ": measured peak "
                           << run.peak_bytes << " B, predicted " << step.peak_bytes << " B (error "
                           << error << ")");
    }
  }
}
