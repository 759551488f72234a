// The step walk under PyTorch's tensor-parallel plans (simulator.hpp, StepInput::tensor_parallel),
// through simulate_parallel_step as `planner estimate` calls it: the model states of the corpora's
// layouts by hand, DDP's bucket copy, and the collectives' bytes. The corpora's whole steps run
// through the planner's command (tests/planner/test_oracle_parallel.cpp):
//   oracle_tensor_parallel.json  t = 2 on gloo CPU ranks, HF's Llama (llama-h256), fp32, foreach
//                                AdamW, no data parallelism: transformers' tp_plan (hf) and
//                                torchtitan's sequence-parallel layout (sp)
//                                (validation/measure_tensor_parallel.py)
//   oracle_fsdp_tp.json          FSDP2 over torchtitan's sequence-parallel TP, dp_shard 2 x tp 2
//                                (validation/measure_fsdp_tp.py)
#include <doctest/doctest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "costmodel/accounting.hpp"
#include "costmodel/parallel_memory.hpp"
#include "costmodel/parallel_step.hpp"
#include "documents/recipe.hpp"
#include "oracle_corpus.hpp"
#include "tests/test_support.hpp"

using namespace shardplan::costmodel;
using namespace shardplan::documents;
using nlohmann::json;

namespace {

// A corpus case's job on `world` CPU ranks (the corpora count tensors only: no context, NCCL
// workspace or fragmentation) under `recipe`, fp32, flash attention, AdamW, its model's config.
struct CpuCase {
  ModelSpec model;
  HardwareProfile hardware;
  StepInput in;
  ParallelLayout layout;
  CpuCase(const json& corpus, const json& c, Recipe recipe, const std::string& strategy,
          int world) {
    const std::string config = c.at("config").get<std::string>();
    model = model_from_hf_config(corpus.at("configs").at(config), config);
    hardware.is_cpu = true;
    layout.tensor_parallel = c.at("tensor_parallel").get<int>();
    layout.sequence_parallel = c.value("sequence_parallel", c.value("layout", "") == "sp");
    in.model = &model;
    in.hardware = &hardware;
    in.cluster = {world, world};
    in.job.seq_len = c.at("seq_len").get<std::int64_t>();
    in.job.micro_batch = c.at("micro_batch").get<std::int64_t>();
    in.job.global_batch = in.job.micro_batch * (world / layout.tensor_parallel);
    in.job.precision = Precision::fp32;
    in.job.attention = AttentionImpl::flash;
    in.job.optimizer = Optimizer::adamw;
    in.job.recipe = recipe;
    in.job.loss = recipe_traits(recipe).loss;
    set_checkpointing(in.job, c.at("checkpointing").get<std::string>(), "checkpointing");
    in.spec = make_spec(strategy, std::nullopt, world);
    in.spec.reduce_dtype = DType::fp32;  // torchtitan's MixedPrecisionPolicy: fp32 reduction
  }
  CpuCase(const CpuCase&) = delete;  // `in` points into it
  CpuCase& operator=(const CpuCase&) = delete;
  StepResult run() const { return simulate_parallel_step(in, layout).step; }
};

const json* find_case(const json& corpus, const std::string& id) {
  for (const auto& c : corpus.at("cases"))
    if (c.at("id") == id) return &c;
  return nullptr;
}

double category(const Breakdown& b, Category c) { return b[static_cast<int>(c)]; }

// Llama-3-8B on 8 H100s, s = 8192, b = 1, global batch 4, under `recipe` with its loss, the
// job's checkpointing and the plan's strategy: the job of the bytes-per-step derivations below.
struct Llama8b {
  ModelSpec model = load_model("llama-3-8b");
  HardwareProfile hardware = load_hardware("h100-sxm5-80gb");
  StepInput in;
  Llama8b(Recipe recipe, Checkpointing mode, const std::string& strategy, Flavour flavour) {
    in.model = &model;
    in.hardware = &hardware;
    in.cluster = {8, 8};
    in.job.seq_len = 8192;
    in.job.micro_batch = 1;
    in.job.global_batch = 4;
    in.job.recipe = recipe;
    in.job.loss = recipe_traits(recipe).loss;
    in.job.checkpointing = mode;
    in.spec = make_spec(strategy, flavour, 8);
  }
  Llama8b(const Llama8b&) = delete;  // `in` points into it
  Llama8b& operator=(const Llama8b&) = delete;
  ParallelStep run(int t, bool sp, bool async = false) const {
    ParallelLayout l;
    l.tensor_parallel = t;
    l.sequence_parallel = sp;
    l.async_tensor_parallel = async;
    return simulate_parallel_step(in, l);
  }
};

}  // namespace

// The plans' model states for llama-h256 (h = 256, 8 heads of 32 over 2 key/value heads,
// I = 704, V = 4096, 4 blocks, untied), t = 2, fp32 AdamW, by hand. A block's matrices:
// 256·(256 + 64 + 64) + 256·256 + 3·256·704 = 704,512, split 352,256, plus its two norms 512;
// the embedding and the head 4096·256 = 1,048,576 each; the final norm 256.
//   hf: 4·(352,256 + 512) + 1,048,576 (replicated) + 524,288 + 256 = 2,984,192 elements, the
//       gradients as many; the foreach groups: 1,933,312 split (DTensor) elements beside
//       1,048,576 + 9·256 = 1,050,880 plain ones, the larger's intermediate 4·1,933,312 bytes
//   sp: 4·(352,256 + 512) + 524,288 + 524,288 + 256 = 2,459,904 elements, the gradients
//       524,288 more (the row-wise table's whole [V, h]); one group, its intermediate 4·2,459,904
// Both ranks are one TP group: no data-parallel group for DDP to wrap, no bucket copy.
TEST_CASE("tp_walk::PyTorch TP plans' model states, hand-derived") {
  const json corpus = shardplan::oracle::read_corpus("oracle_tensor_parallel.json");
  for (const bool sp : {false, true}) {
    const json* c = find_case(corpus, sp ? "tp2-sp/llama-h256/fp32/none/s128-b1"
                                         : "tp2-hf/llama-h256/fp32/none/s128-b1");
    REQUIRE(c != nullptr);
    const CpuCase k(corpus, *c, sp ? Recipe::torchtitan : Recipe::hf, "ddp", 2);
    const StepResult r = k.run();
    REQUIRE(r.valid);
    const double E = sp ? 2459904 : 2984192;
    CHECK(category(r.model_states, Category::parameters) == 4 * E);
    CHECK(category(r.model_states, Category::gradients) == 4 * (sp ? E + 524288 : E));
    CHECK(category(r.model_states, Category::optimizer_states) == 8 * E);
    CHECK(category(r.at_peak, Category::buffers) == 0);
    if (r.peak_when == "optimizer step")
      CHECK(category(r.at_peak, Category::optimizer_states) == 8 * E + 4 * (sp ? E : 1933312));
  }
}

// DDP's bucket copy of the gradients (ShardingSpec::grad_bucket_copy) only where there is a
// data-parallel group for DDP to wrap: with world = 2t the copy of the rank's whole gradients,
// 4 · 2,984,192 bytes (the hf plan's elements per rank, derived above).
TEST_CASE("tp_walk::DDP's bucket copy only over a data-parallel group") {
  const json corpus = shardplan::oracle::read_corpus("oracle_tensor_parallel.json");
  const json* c = find_case(corpus, "tp2-hf/llama-h256/fp32/none/s128-b1");
  REQUIRE(c != nullptr);
  const CpuCase alone(corpus, *c, Recipe::hf, "ddp", 2);
  const CpuCase replicated(corpus, *c, Recipe::hf, "ddp", 4);
  REQUIRE(replicated.in.spec.grad_bucket_copy);
  const StepResult a = alone.run(), b = replicated.run();
  REQUIRE(a.valid);
  REQUIRE(b.valid);
  CHECK(b.allocated_peak_bytes - a.allocated_peak_bytes == 4.0 * 2984192);
}

// torchtitan's 2-D layout by hand for llama-h256 under t = 2 and FSDP over 2: per TP rank the
// row-wise embedding 524,288, each block 352,256 + 512 (its two norms whole), the head 524,288
// and the final norm 256: 2,459,904 elements, 1,229,952 per rank after FSDP, the corpus's
// local_params. fp32 AdamW: 4 bytes of parameter and 8 of moments per element. The peak is the
// embedding's backward (measured there too): every group's sharded gradient but the embedding's
// (1024 x 256 per rank) made, the table's whole [V, h] gradient (4 · 1,048,576) and FSDP2's copy
// of the rank's rows taken from it (4 · 524,288), the table gathered (4 · 524,288) and block 0's
// reduce-scatter input kept (4 · 352,768).
TEST_CASE("tp_walk::FSDP2 over TP: the sharded model states and the embedding's moment, "
          "hand-derived") {
  const json corpus = shardplan::oracle::read_corpus("oracle_fsdp_tp.json");
  const json* c = find_case(corpus, "fsdp2-tp2-sp/llama-h256/fp32/none/s128-b1");
  REQUIRE(c != nullptr);
  const double E = 1229952;
  CHECK(c->at("local_params").get<double>() == E);
  CpuCase k(corpus, *c, Recipe::torchtitan, "fsdp-full", 4);
  k.in.spec = make_spec("fsdp-full", Flavour::fsdp2, 4);
  k.in.spec.reduce_dtype = DType::fp32;
  const StepResult r = k.run();
  REQUIRE(r.valid);
  CHECK(category(r.model_states, Category::parameters) == 4 * E);
  CHECK(category(r.model_states, Category::gradients) == 4 * E);
  CHECK(category(r.at_peak, Category::optimizer_states) == 8 * E);
  CHECK(shardplan::test::contains(r.peak_when, "backward of embeddings"));
  CHECK(category(r.at_peak, Category::gradients) ==
        4 * (E - 262144) + 4 * 1048576.0 + 4 * 524288.0);
  CHECK(category(r.at_peak, Category::buffers) == 4 * 524288.0 + 4 * 352768.0);
}

// The collectives of one micro-batch, by hand (Megatron-LM's pattern as torch's styles run it:
// Shoeybi et al. 2019, §3; Korthikanti et al. 2022, §4.2.2): Llama-3-8B, s = 8192, b = 1, bf16, so
// the [T, h] activation is 2 · 8192 · 4096 = 67,108,864 bytes; t = 2, a ring collective sends
// (t − 1)/t of it: 33,554,432. Sequence parallel: a block's forward 2 all-gathers + 2
// reduce-scatters, its backward the same, torchtitan's op-level rerun 2 all-gathers + 1
// reduce-scatter: 11 sends a block, 32 blocks; the row-wise table's output reduce-scattered and
// its gradient all-gathered, the head's input all-gathered and its gradient reduce-scattered: 4
// more. 356 sends, 11,945,377,792 bytes. Without sequence parallelism: 2 all-reduces each way
// (2(t − 1)/t each: 67,108,864) and 1 in the rerun, 5 a block, and the table's output and the
// head's input gradient all-reduced: 162 · 67,108,864 = 10,871,635,968.
TEST_CASE("tp_walk::tensor parallelism's bytes per step, hand-derived") {
  const Llama8b k(Recipe::torchtitan, Checkpointing::selective_op, "fsdp-full", Flavour::fsdp2);
  for (const bool sp : {true, false}) {
    const ParallelStep r = k.run(2, sp);
    REQUIRE(r.step.valid);
    CHECK(r.tp_bytes == doctest::Approx(sp ? 11945377792.0 : 10871635968.0));
    CHECK(r.step.comm_bytes_per_gpu == doctest::Approx(r.tp_bytes + r.dp_bytes));
    if (!sp) continue;
    // The blocking collectives are exposed in full; async TP overlaps them with the GEMMs.
    const ParallelStep async = k.run(2, true, true);
    CHECK(async.tp_exposed_s < r.tp_exposed_s);
    CHECK(async.step.step_s < r.step.step_s);
  }
}

// Megatron-core's TP in the walk: the same collectives per block (Megatron-LM's own pattern),
// none in the rerun of its selective recompute (the attention core alone), the forward's again
// in a fully checkpointed block's; its vocabulary-parallel embedding and head as torchtitan's.
// Llama-3-8B as above, t = 2 with sequence parallelism: 8 sends of 33,554,432 bytes a block, 12
// under full checkpointing; 32 blocks; 4 for the embedding and the head.
TEST_CASE("tp_walk::Megatron-core's TP: its collectives' bytes, hand-derived") {
  for (const Checkpointing mode : {Checkpointing::selective_attention, Checkpointing::full}) {
    const ParallelStep r = Llama8b(Recipe::megatron, mode, "zero1", Flavour::megatron).run(2, true);
    REQUIRE(r.step.valid);
    const double sends = mode == Checkpointing::full ? 12 : 8;
    CHECK(r.tp_bytes == doctest::Approx((32 * sends + 4) * 33554432.0));
  }
}

// The terms Megatron-core's TP splits (layer_activations: Korthikanti et al. 2022, Table 2) add
// up at t = 1 to the block the 1D walk keeps under the megatron recipe (block_activations), for
// each architecture, attention and dtype: one block, split or not.
TEST_CASE("tp_walk::Megatron-core's split terms at t = 1 are the 1D walk's block") {
  for (const char* name : {"llama-3-8b", "gpt2", "mistral-7b"})
    for (const AttentionImpl a : {AttentionImpl::flash, AttentionImpl::eager})
      for (const double e : {2.0, 4.0}) {
        CAPTURE(name);
        const ModelSpec m = load_model(name);
        TrainingJob j;
        j.seq_len = 1024;
        j.micro_batch = 2;
        j.global_batch = 2;
        j.recipe = Recipe::megatron;
        j.attention = a;
        j.checkpointing = Checkpointing::none;
        const ParallelLayout one;
        CHECK(layer_activations(m, j, one, e).total() ==
              doctest::Approx(block_activations(m, j, Forward{e, e, true}, false).saved));
      }
}

// A tied table under PyTorch's TP plans is one parameter the embedding and the head would place
// differently: refused, naming the flag. Megatron-core's vocabulary-parallel embedding and head
// share the rank's rows: walked.
TEST_CASE("tp_walk::tied embeddings: refused under PyTorch's plans, walked under Megatron's") {
  const ModelSpec m = load_model("gpt2");
  const HardwareProfile hw = load_hardware("a100-sxm4-80gb");
  StepInput in;
  in.model = &m;
  in.hardware = &hw;
  in.cluster = {8, 8};
  in.job.seq_len = 1024;
  in.job.micro_batch = 1;
  in.job.global_batch = 4;
  ParallelLayout l;
  l.tensor_parallel = 2;
  for (const Recipe r : {Recipe::hf, Recipe::megatron}) {
    in.job.recipe = r;
    in.job.loss = recipe_traits(r).loss;
    in.spec = make_spec("ddp", r == Recipe::hf ? Flavour::ddp : Flavour::megatron, 8);
    const StepResult s = simulate_parallel_step(in, l).step;
    CHECK(s.valid == (r == Recipe::megatron));
    if (r == Recipe::hf) {
      CHECK(s.reason_input == "--tensor-parallel");
      CHECK(shardplan::test::contains(s.reason, "tied embeddings"));
    }
  }
}

// The executor's recipe under tensor parallelism (executor_tensors with t), one stage, DDP fp32,
// t = 2: a Llama of 4 blocks, h = 64, 4 heads of 16 over 2 key/value heads, I = 128, V = 64,
// s = 32, b = 2 (N = 64), eager attention. The hand derivation of every term is in
// tests/executor/test_tensor_parallel_mpi.cpp ("measured memory against the cost model's
// per-stage prediction"), where the executor's measured peak is held to it; here the cost model
// alone: E = 78,400 elements per rank (vocabulary-parallel embedding and head), 4E of parameters,
// 8E of AdamW moments, 4E of DDP's bucket copy; at the peak (the last block's MLP backward) the
// head's and the last block's gradients 4·(2,112 + 18,560) = 82,688 (allocated at first use) and
// 690,688 bytes of activations (566,784 with sequence parallelism).
TEST_CASE("tp_walk::the executor's tensor-parallel stage: first-use gradients, DDP's bucket "
          "copy") {
  const json config = {{"architectures", {"LlamaForCausalLM"}},
                       {"hidden_size", 64},
                       {"num_hidden_layers", 4},
                       {"num_attention_heads", 4},
                       {"num_key_value_heads", 2},
                       {"head_dim", 16},
                       {"intermediate_size", 128},
                       {"vocab_size", 64},
                       {"max_position_embeddings", 64},
                       {"tie_word_embeddings", false},
                       {"hidden_act", "silu"}};
  const ModelSpec m = model_from_hf_config(config, "llama-small");
  HardwareProfile hw;
  hw.is_cpu = true;
  StepInput in;
  in.model = &m;
  in.hardware = &hw;
  in.cluster = {2, 2};
  in.job.seq_len = 32;
  in.job.micro_batch = 2;
  in.job.global_batch = 2;
  in.job.attention = AttentionImpl::eager;
  in.job.precision = Precision::fp32;
  in.job.checkpointing = Checkpointing::none;
  in.job.recipe = Recipe::executor;
  in.spec = make_spec("ddp", Flavour::ddp, 1);
  for (const bool sp : {false, true}) {
    CAPTURE(sp);
    ParallelLayout l;
    l.tensor_parallel = 2;
    l.sequence_parallel = sp;
    const StepResult r = simulate_parallel_step(in, l).step;
    REQUIRE(r.valid);
    CHECK(category(r.at_peak, Category::parameters) == 4 * 78400);
    CHECK(category(r.at_peak, Category::optimizer_states) == 8 * 78400);
    CHECK(category(r.at_peak, Category::buffers) == 4 * 78400);
    CHECK(category(r.at_peak, Category::gradients) == 82688);
    CHECK(category(r.at_peak, Category::activations) == (sp ? 566784 : 690688));
    CHECK(r.allocated_peak_bytes == (sp ? 1903872 : 2027776));
  }
}

// transformers' lm_head "colwise_rep" all-gathers the logits for the model's own loss: Llama-3-8B,
// t = 2, no sequence parallelism, s = 8192, bf16: the logits [T, V] are 2 · 8192 · 128,256 =
// 2,101,346,304 bytes, of which a rank sends half, 1,050,673,152, beside the head's input
// gradient all-reduced (67,108,864); no embedding collective (its table is replicated). With
// torchtitan's loss_parallel the logits stay split: the difference is the gather alone.
TEST_CASE("tp_walk::transformers' colwise_rep head gathers the logits") {
  auto tp_bytes = [](Recipe r) {
    const ParallelStep s = Llama8b(r, Checkpointing::none, "ddp", Flavour::ddp).run(2, false);
    REQUIRE(s.step.valid);
    return s.tp_bytes;
  };
  // Blocks: 4 all-reduces each of 67,108,864 sent, 32 blocks.
  const double blocks = 32 * 4 * 67108864.0;
  CHECK(tp_bytes(Recipe::hf) == doctest::Approx(blocks + 1050673152.0 + 67108864.0));
  CHECK(tp_bytes(Recipe::torchtitan) == doctest::Approx(blocks + 2 * 67108864.0));
}
