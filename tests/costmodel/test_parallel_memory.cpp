#include <doctest/doctest.h>

#include "costmodel/accounting.hpp"
#include "costmodel/parallel_memory.hpp"
#include "costmodel/parallel_step.hpp"
#include "tests/test_support.hpp"

using shardplan::test::contains;
using namespace shardplan::costmodel;
using namespace shardplan::documents;
using nlohmann::json;

namespace {

// GPT-3 175B's shapes (Brown et al. 2020, Table 2.1; Korthikanti et al. 2022, Table 3): h = 12288,
// a = 96, s = 2048, 96 layers, with GPT-2's block (LayerNorm, 4h GELU MLP, dropout everywhere).
ModelSpec gpt3() {
  const json config = {{"architectures", {"GPT2LMHeadModel"}},
                       {"n_embd", 12288},
                       {"n_head", 96},
                       {"n_layer", 96},
                       {"n_positions", 2048},
                       {"vocab_size", 51200}};
  return model_from_hf_config(config, "gpt3-175b");
}

TrainingJob job(std::int64_t seq, std::int64_t micro, AttentionImpl attention) {
  TrainingJob j;
  j.seq_len = seq;
  j.micro_batch = micro;
  j.global_batch = micro;
  j.attention = attention;
  j.recipe = Recipe::megatron;
  return j;
}

ParallelLayout tp(int t, bool sp) {
  ParallelLayout l;
  l.tensor_parallel = t;
  l.sequence_parallel = sp;
  return l;
}

}  // namespace

// Korthikanti et al. 2022, Table 2, bytes per layer with 2-byte activations; GPT-3 shapes,
// s = 2048, b = 1: s·b·h = 2048·12288 = 25,165,824 and 5·a·s/h = 5·96·2048/12288 = 80.
//   no parallelism:            sbh·(34 + 80)          = 2,868,903,936
//   tensor parallel t = 8:     sbh·(10 + 24/8 + 80/8) = sbh·23     = 578,813,952
//   t = 8 with sequence par.:  sbh/8·(34 + 80)        = sbh·14.25  = 358,612,992
TEST_CASE("parallel_memory::Korthikanti Table 2 bytes per layer with t and sequence parallelism") {
  const auto m = gpt3();
  const auto j = job(2048, 1, AttentionImpl::eager);
  CHECK(layer_activations(m, j, tp(1, false), 2).total() == doctest::Approx(2868903936.0));
  CHECK(layer_activations(m, j, tp(8, false), 2).total() == doctest::Approx(578813952.0));
  CHECK(layer_activations(m, j, tp(8, true), 2).total() == doctest::Approx(358612992.0));
  // The core alone: 5as²b/t = 5·96·2048²·1/8 = 251,658,240 (what selective recompute drops).
  CHECK(layer_activations(m, j, tp(8, true), 2).core == doctest::Approx(251658240.0));
  // At t = 1 the split counts the same tensors as the Megatron block of the unsplit accounting.
  CHECK(layer_activations(m, j, tp(1, false), 2).total() ==
        doctest::Approx(block_activations(m, j, Forward{}, false).saved));
}

// Llama-3-70B (h = q = 8192, 8 kv heads of 128: kv = 1024, a = 64, SwiGLU I = 28672, no dropout,
// flash attention), s = 8192, b = 1, t = 8 with sequence parallelism, e = 2:
//   outside: norm inputs 2·2Th + the QKV and MLP inputs 2·2Th = 8·8192·8192 = 536,870,912, /8 =
//            67,108,864
//   inside:  Q, K, V 2T(8192 + 2048) = 167,772,160; projection input 2T·8192 = 134,217,728;
//            SwiGLU 3·2T·28672 = 1,409,286,144; log-sum-exp 4·64·T = 2,097,152; sum
//            1,713,373,184, /8 = 214,171,648
//   total 281,280,512 per layer.
TEST_CASE("parallel_memory::SwiGLU and grouped-query attention terms") {
  const auto m = load_model("llama-3-70b");
  const auto j = job(8192, 1, AttentionImpl::flash);
  const auto a = layer_activations(m, j, tp(8, true), 2);
  CHECK(a.outside == doctest::Approx(67108864.0));
  CHECK(a.inside == doctest::Approx(214171648.0));
  CHECK(layer_activations(m, j, tp(1, false), 2).total() ==
        doctest::Approx(block_activations(m, j, Forward{}, false).saved));
  // Context parallelism 4 splits every term by the local sequence 8192/4.
  ParallelLayout cp = tp(8, true);
  cp.context_parallel = 4;
  CHECK(layer_activations(m, j, cp, 2).total() == doctest::Approx(281280512.0 / 4));
}

// Megatron's TP and PP through the walk (simulate_parallel_step): Llama-3-70B on 256 GPUs,
// t = 8 with sequence parallelism, p = 4 (20 blocks a stage), d = 8, 8 micro-batches of one
// sequence of 8192 tokens.
TEST_CASE("parallel_memory::per-stage imbalance: the first stage holds the embeddings and p "
          "micro-batches") {
  const auto m = load_model("llama-3-70b");
  const auto hw = load_hardware("h100-sxm5-80gb");
  StepInput in;
  in.model = &m;
  in.hardware = &hw;
  in.cluster = {256, 8};
  in.job = job(8192, 1, AttentionImpl::flash);
  in.job.global_batch = 64;  // d = 256/32 = 8, m = 8
  in.spec = make_spec("ddp", recipe_traits(Recipe::megatron).flavour_for("ddp"), 8);
  ParallelLayout l = tp(8, true);
  l.pipeline_parallel = 4;
  l.micro_batches = 8;
  const auto step = simulate_parallel_step(in, l);
  REQUIRE(step.step.valid);
  const auto& mem = step.memory;
  REQUIRE(mem.stages.size() == 4);
  // Elements per rank: a block's matrices 8192·(8192 + 1024 + 1024 + 8192 + 3·28672) =
  // 855,638,016 split by 8 = 106,954,752, plus its two norms 16,384 whole: 106,971,136; 20 blocks
  // per stage. Stage 0 adds the vocabulary-parallel embedding 128256·8192/8 = 131,334,144.
  CHECK(mem.stages[1].local_params == doctest::Approx(20 * 106971136.0));
  CHECK(mem.stages[0].local_params - mem.stages[1].local_params == doctest::Approx(131334144.0));
  // The last stage: the head's projection (split) and the final norm (whole).
  CHECK(mem.stages[3].local_params - mem.stages[1].local_params ==
        doctest::Approx(131334144.0 + 8192));
  // Activations on stage 0 at its peak: 4 micro-batches in flight (1F1B: p), each 20 layers of
  // 281,280,512 (the test above): at least 4·20·281,280,512 = 22,502,440,960, and less than a
  // fifth micro-batch more.
  const auto& s0 = mem.stages[0];
  CHECK(s0.in_flight == doctest::Approx(4));
  CHECK(s0.activation_bytes >= 4 * 20 * 281280512.0);
  CHECK(s0.activation_bytes < 5 * 20 * 281280512.0);
  CHECK(mem.stages[3].in_flight == doctest::Approx(1));
  CHECK(mem.peak_stage == 0);
  CHECK(contains(mem.peak_name, "stage 0 of 4 (embeddings, 20 blocks, 4 micro-batches in flight)"));
  // Megatron's distributed-optimizer-less DDP keeps an fp32 master and two fp32 moments per
  // element: 12 bytes; FSDP2 steps its fp32 shards in place, two fp32 moments sharded over the 8
  // data-parallel ranks: 8·20·106,971,136/8 = 2,139,422,720 bytes on stage 1.
  CHECK(mem.stages[1].optimizer_bytes == doctest::Approx(12 * 20 * 106971136.0));
  in.spec = make_spec("fsdp-full", Flavour::fsdp2, 8);
  const auto sharded = simulate_parallel_step(in, l);
  REQUIRE(sharded.step.valid);
  CHECK(sharded.memory.stages[1].optimizer_bytes == doctest::Approx(2139422720.0));
}
