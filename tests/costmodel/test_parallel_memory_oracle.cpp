// parallel_memory's parts under PyTorch's own tensor parallelism (the whole steps of
// tests/costmodel/data/oracle_tensor_parallel.json, validation/measure_tensor_parallel.py, run
// through the planner's command: tests/planner/test_oracle_parallel.cpp).
// torch's DTensor TP styles with t = 2 on gloo CPU ranks, HF's Llama (llama-h256), fp32, foreach
// AdamW, MemTracker over the second step; both ranks are one TP group (no data parallelism, no
// DDP). Two layouts: "hf", transformers' tp_plan with the model's own loss (Recipe::hf), and "sp",
// torchtitan's sequence-parallel layout with loss_parallel (Recipe::torchtitan).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "costmodel/parallel_memory.hpp"
#include "documents/recipe.hpp"
#include "oracle_corpus.hpp"

using namespace shardplan::costmodel;
using namespace shardplan::documents;
using nlohmann::json;

namespace {

// A corpus case on one CPU rank of a TP group (the corpora count tensors only: no context, NCCL
// workspace or fragmentation): its model, and its job under `recipe` with the case's shape,
// checkpointing and split, fp32, flash attention, AdamW. Holds the model and the hardware the
// input points at.
struct CpuCase {
  ModelSpec model;
  HardwareProfile hardware;
  ParallelMemoryInput in;
  CpuCase(const json& corpus, const json& c, Recipe recipe, bool sequence_parallel) {
    const std::string config = c.at("config").get<std::string>();
    model = model_from_hf_config(corpus.at("configs").at(config), config);
    hardware.is_cpu = true;
    const int t = c.at("tensor_parallel").get<int>();
    in.model = &model;
    in.hardware = &hardware;
    in.cluster = {t, t};
    in.job.seq_len = c.at("seq_len").get<std::int64_t>();
    in.job.micro_batch = c.at("micro_batch").get<std::int64_t>();
    in.job.global_batch = in.job.micro_batch;
    in.job.precision = Precision::fp32;
    in.job.attention = AttentionImpl::flash;
    in.job.optimizer = Optimizer::adamw;
    in.job.recipe = recipe;
    in.job.loss = recipe_traits(recipe).loss;
    set_checkpointing(in.job, c.at("checkpointing").get<std::string>(), "checkpointing");
    in.layout.tensor_parallel = t;
    in.layout.sequence_parallel = sequence_parallel;
  }
  CpuCase(const CpuCase&) = delete;  // `in` points into it
  CpuCase& operator=(const CpuCase&) = delete;
};

// The job and plan of a corpus case, predicted by parallel_memory for one rank.
StageMemory predict(const json& corpus, const json& c) {
  const bool sp = c.at("layout") == "sp";
  CpuCase k(corpus, c, sp ? Recipe::torchtitan : Recipe::hf, sp);
  k.in.spec = make_spec("ddp", Flavour::ddp, 1);
  k.in.spec.grad_bucket_copy = false;  // the bare model: no DDP buckets
  const auto walk = walk_schedule(PipelineSchedule::one_f_one_b, 1, 1, 1, {1.0}, {2.0});
  return parallel_memory(k.in, walk).stages.at(0);
}

}  // namespace

// The split of a block that tensor parallelism divides (BlockParts) adds up to the block
// accounting's saved bytes, for every architecture, attention, dtype and recipe whose block the
// frameworks' code defines.
TEST_CASE("parallel_memory::a block's parts add up to its saved bytes") {
  const json neox = {{"architectures", {"GPTNeoXForCausalLM"}},
                     {"hidden_size", 512},
                     {"num_attention_heads", 8},
                     {"num_hidden_layers", 2},
                     {"intermediate_size", 2048},
                     {"vocab_size", 1000},
                     {"max_position_embeddings", 1024}};
  for (const char* name : {"llama-3-8b", "gpt2", "neox"}) {
    const ModelSpec m =
        std::string(name) == "neox" ? model_from_hf_config(neox, name) : load_model(name);
    for (const Recipe r : {Recipe::hf, Recipe::torchtitan})
      for (const AttentionImpl a : {AttentionImpl::flash, AttentionImpl::eager})
        for (const Forward f : {Forward{4, 4, false}, Forward{2, 4, true}, Forward{2, 2, true}}) {
          CAPTURE(name);
          TrainingJob j;
          j.seq_len = 512;
          j.micro_batch = 2;
          j.global_batch = 2;
          j.recipe = r;
          j.attention = a;
          j.checkpointing = Checkpointing::none;
          CHECK(framework_block_parts(m, j, f).total() ==
                doctest::Approx(block_activations(m, j, f, false).saved));
          CHECK(final_norm_parts(m, j, f).total() <= head_activations(m, j, f).saved);
        }
  }
}

// The plans' model states for llama-h256 (h = 256, 8 heads of 32 over 2 key/value heads,
// I = 704, V = 4096, 4 blocks, untied), t = 2, fp32 AdamW, by hand. A block's matrices:
// 256·(256 + 64 + 64) + 256·256 + 3·256·704 = 704,512, split 352,256, plus its two norms 512;
// the embedding and the head 4096·256 = 1,048,576 each; the final norm 256.
//   hf: 4·(352,256 + 512) + 1,048,576 (replicated) + 524,288 + 256 = 2,984,192 elements, the
//       gradients as many; the foreach groups: 1,933,312 split (DTensor) elements beside
//       1,048,576 + 9·256 = 1,050,880 plain ones, the larger's intermediate 4·1,933,312 bytes
//   sp: 4·(352,256 + 512) + 524,288 + 524,288 + 256 = 2,459,904 elements, the gradients
//       524,288 more (the row-wise table's whole [V, h]); one group, its intermediate 4·2,459,904
TEST_CASE("parallel_memory::PyTorch TP plans' model states, hand-derived") {
  const json corpus = shardplan::oracle::read_corpus("oracle_tensor_parallel.json");
  int checked = 0;
  for (const auto& c : corpus.at("cases")) {
    if (c.at("id") != "tp2-hf/llama-h256/fp32/none/s128-b1" &&
        c.at("id") != "tp2-sp/llama-h256/fp32/none/s128-b1")
      continue;
    const bool sp = c.at("layout") == "sp";
    const StageMemory s = predict(corpus, c);
    const double E = sp ? 2459904 : 2984192;
    CHECK(s.local_params == E);
    CHECK(s.param_bytes == 4 * E);
    CHECK(s.grad_bytes == 4 * (sp ? E + 524288 : E));  // at the optimizer step
    CHECK(s.optimizer_bytes == 8 * E + 4 * (sp ? E : 1933312));
    CHECK(s.moment == "optimizer step");
    ++checked;
  }
  CHECK(checked == 2);
}

// DDP's bucket copy of the gradients (ShardingSpec::grad_bucket_copy) is counted under PyTorch's
// TP recipes only when there is a data-parallel group for DDP to wrap: with world = t no DDP
// (torchtitan's parallelize applies it only for a replicate degree above 1; transformers' tp_plan
// wraps nothing); with world = 2t the copy of the rank's whole gradients, 4 · 2,984,192 bytes
// (the hf plan's elements per rank, derived above).
TEST_CASE("parallel_memory::PyTorch TP plans: DDP's bucket copy only over a data-parallel group") {
  const json corpus = shardplan::oracle::read_corpus("oracle_tensor_parallel.json");
  for (const auto& c : corpus.at("cases")) {
    if (c.at("id") != "tp2-hf/llama-h256/fp32/none/s128-b1") continue;
    const std::string config = c.at("config").get<std::string>();
    const ModelSpec m = model_from_hf_config(corpus.at("configs").at(config), config);
    HardwareProfile hw;
    hw.is_cpu = true;
    ParallelMemoryInput in;
    in.model = &m;
    in.hardware = &hw;
    in.job.seq_len = 128;
    in.job.micro_batch = 1;
    in.job.global_batch = 1;
    in.job.precision = Precision::fp32;
    in.job.optimizer = Optimizer::adamw;
    in.job.recipe = Recipe::hf;
    in.job.loss = recipe_traits(in.job.recipe).loss;
    in.spec = make_spec("ddp", Flavour::ddp, 1);
    REQUIRE(in.spec.grad_bucket_copy);
    in.layout.tensor_parallel = 2;
    const auto walk = walk_schedule(PipelineSchedule::one_f_one_b, 1, 1, 1, {1.0}, {2.0});
    in.cluster = {2, 2};
    CHECK(parallel_memory(in, walk).stages.at(0).buffer_bytes == 0);
    in.cluster = {4, 4};
    in.job.global_batch = 2;
    CHECK(parallel_memory(in, walk).stages.at(0).buffer_bytes == 4.0 * 2984192);
    return;
  }
  FAIL("the corpus has no tp2-hf/llama-h256/fp32/none/s128-b1 case");
}

// torchtitan's own Llama under its own tensor parallelism (validation/measure_tp_units.py:
// tests/costmodel/data/oracle_tp_units.json; torchtitan 0.3.0, t = 2 with sequence parallelism,
// fp32 on CPU ranks): what a block keeps for backward with no checkpointing, full checkpointing
// and torchtitan's op-level save list, against the block parallel_memory counts for every block of
// a stage, and what the head keeps (its vocabulary-parallel loss's fp32 log-probabilities
// [T, V/2], the targets, the final norm's state on T/2 tokens and the projection's gathered input;
// the corpus also counts the loss's 8-byte scalar). Hand check of the save list at s128-b1 (T = 128
// tokens, h = 128, q = 128, kv = 32, I = 352, 8 heads, 4 bytes): the input [T/2, h] 32,768 + wqkv's
// output [T, (q + 2kv)/2] 49,152 + the attention's output [T, q/2] 32,768 and log-sum-exp [4 heads,
// T] 2,048 + w1's output [T, I/2] 90,112 + w2's output, its partial sum whole, [T, h] 65,536 =
// 272,384 bytes.
TEST_CASE(
    "parallel_memory::torchtitan's own TP: each block keeps what its code saves, selective-op "
    "included") {
  const json corpus = shardplan::oracle::read_corpus("oracle_tp_units.json");
  int cases = 0;
  double worst = 0;
  for (const auto& c : corpus.at("cases")) {
    CpuCase k(corpus, c, Recipe::torchtitan, c.at("sequence_parallel").get<bool>());
    k.in.spec = make_spec("fsdp-full", Flavour::fsdp2, 1);  // torchtitan's engine (fp32: no cast)
    const auto& in = k.in;
    const bool full = c.at("checkpointing") == "full";
    const auto& units = c.at("units");
    for (const char* unit : {"block 1", "head"}) {
      const double predicted =
          std::string(unit) == "head" ? torch_tp_head(in).saved : torch_tp_block(in, full).saved;
      const double measured = units.at(unit).at("activation_bytes").get<double>();
      INFO(c.at("id").get<std::string>()
           << " " << unit << ": predicted " << predicted << ", measured " << measured);
      CHECK(predicted == doctest::Approx(measured).epsilon(0.01));
      worst = std::max(worst, std::abs(predicted - measured) / measured);
    }
    if (c.at("id") == "tp2-sp/torchtitan-llama3-h128/fp32/selective-op/s128-b1")
      CHECK(units.at("block 1").at("activation_bytes") == 272384);
    ++cases;
  }
  CHECK(cases == 12);
  MESSAGE("torchtitan's TP blocks and heads: worst error " << 100 * worst << "%");
}
