// The parts of a block and a head under PyTorch's own tensor parallelism that the step walk counts
// (parallel_memory.hpp, torch_tp_block and torch_tp_head; the whole steps of
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

}  // namespace

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
// 272,384 bytes. The same blocks compiled as torchtitan's apply_compile does it under TP (its loss
// compiled too): the one-rank compiled block's tensors split as TP splits them, the norms' outputs
// kept gathered. By hand at s128-b1 without checkpointing: the input and the attention
// projection's scattered output [T/2, h] 2 × 32,768, each norm's fp32 rstd [T/2] 2 × 256 and
// gathered output [T, h] 2 × 65,536, q [T, q/2] 32,768, k and v [T, kv/2] 2 × 8,192, the
// attention's output 32,768 and log-sum-exp 2,048, w1's and w3's outputs and their product
// [T, I/2] 3 × 90,112 = 551,424 bytes; with the save list, the eager list's without w2's output
// (the backward does not read it) and with the attention projection's scattered output, a
// reduce_scatter_tensor the list saves once it is a graph op: 272,384 - 65,536 + 32,768 = 239,616.
TEST_CASE(
    "parallel_memory::torchtitan's own TP: each block keeps what its code saves, selective-op "
    "and compiled included") {
  const json corpus = shardplan::oracle::read_corpus("oracle_tp_units.json");
  int cases = 0;
  double worst = 0;
  for (const auto& c : corpus.at("cases")) {
    CpuCase k(corpus, c, Recipe::torchtitan, c.at("sequence_parallel").get<bool>());
    k.in.spec = make_spec("fsdp-full", Flavour::fsdp2, 1);  // torchtitan's engine (fp32: no cast)
    k.in.job.compile = c.at("compile").get<bool>();
    // torchtitan compiles its loss too (CompileConfig's components "model" and "loss").
    if (k.in.job.compile) k.in.job.loss = LossImpl::fused;
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
    if (c.at("id") == "tp2-sp-compiled/torchtitan-llama3-h128/fp32/none/s128-b1")
      CHECK(units.at("block 1").at("activation_bytes") == 551424);
    if (c.at("id") == "tp2-sp-compiled/torchtitan-llama3-h128/fp32/selective-op/s128-b1")
      CHECK(units.at("block 1").at("activation_bytes") == 239616);
    ++cases;
  }
  CHECK(cases == 24);
  MESSAGE("torchtitan's TP blocks and heads: worst error " << 100 * worst << "%");
}
