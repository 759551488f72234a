// The model-parallel search: what it ranks, its speed at 16,384 GPUs, and the launch options.
#include <doctest/doctest.h>

#include "planner/parallel_search.hpp"
#include "tests/test_support.hpp"

using shardplan::test::contains;
using namespace shardplan::planner;
using namespace shardplan::costmodel;

namespace {

Scenario scenario(const ModelSpec& m, int gpus, std::int64_t global) {
  Scenario sc;
  sc.model = m;
  sc.hardware = load_hardware("h100-sxm5-80gb");
  sc.cluster = {gpus, 8};
  sc.job.seq_len = 8192;
  sc.job.global_batch = global;
  sc.job.recipe = Recipe::megatron;
  sc.job.loss = LossImpl::fp32_inplace;
  return sc;
}

}  // namespace

TEST_CASE(
    "parallel_search::Llama-3-70B on 256 GPUs: FSDP alone does not fit, model parallelism does") {
  const auto sc = scenario(load_model("llama-3-70b"), 256, 256);
  const auto s = search_layouts(sc);
  REQUIRE(s.best_data_parallel);
  CHECK_FALSE(s.best_data_parallel->fits);  // a whole 8192-token sequence's activations per GPU
  REQUIRE_FALSE(s.ranked.empty());
  for (std::size_t i = 0; i < s.ranked.size(); ++i) {
    CHECK(s.ranked[i].fits);
    CHECK(s.ranked[i].result.step.peak_bytes <= sc.usable_bytes());
    CHECK(s.ranked[i].layout.model_parallel() * s.ranked[i].layout.data_parallel(256) == 256);
    if (i > 0) CHECK(s.ranked[i - 1].result.step.step_s <= s.ranked[i].result.step.step_s);
  }
  CHECK_FALSE(s.ranked.front().layout.trivial());
  CHECK(s.evaluated <= s.layouts * 256);
}

TEST_CASE("parallel_search::405B on 16,384 GPUs is searched in under a second") {
  // Llama 3.1 405B's shapes (its config.json): h 16384, 126 layers, 128 heads, 8 kv heads, MLP
  // 53248, vocabulary 128256.
  const nlohmann::json config = {{"architectures", {"LlamaForCausalLM"}},
                                 {"hidden_size", 16384},
                                 {"intermediate_size", 53248},
                                 {"num_hidden_layers", 126},
                                 {"num_attention_heads", 128},
                                 {"num_key_value_heads", 8},
                                 {"vocab_size", 128256},
                                 {"max_position_embeddings", 131072}};
  const auto sc = scenario(model_from_hf_config(config, "llama-3.1-405b"), 16384, 2048);
  const auto s = search_layouts(sc);
  CHECK(s.seconds < 1.0);
  CHECK_FALSE(s.ranked.empty());
  // 2048 sequences cannot spread over 16,384 GPUs by data parallelism alone: the batch limit.
  CHECK_FALSE(s.best_data_parallel);
  CHECK(contains(layout_search_table(sc, s, 3),
                 "the global batch of 2048 sequences does not divide over 16384 GPUs"));
}

TEST_CASE("parallel_search::torchtitan and Megatron-LM options of a candidate") {
  const auto sc = scenario(load_model("llama-3-70b"), 256, 64);
  LayoutCandidate c;
  c.layout.tensor_parallel = 8;
  c.layout.sequence_parallel = true;
  c.layout.pipeline_parallel = 4;
  c.layout.schedule = PipelineSchedule::interleaved_1f1b;
  c.layout.virtual_stages = 5;  // 80 layers / (4·5) = 4 per chunk
  c.layout.micro_batches = 8;
  c.job = sc.job;
  c.job.micro_batch = 1;
  c.spec = make_spec("fsdp-full", Flavour::fsdp2, 8);
  CHECK(
      torchtitan_options(sc, c) ==
      "--parallelism.data_parallel_replicate_degree 1 --parallelism.data_parallel_shard_degree 8 "
      "--parallelism.tensor_parallel_degree 8 --parallelism.pipeline_parallel_degree 4 "
      "--parallelism.pipeline_parallel_schedule Interleaved1F1B "
      "--parallelism.pipeline_parallel_layers_per_stage 4 "
      "--parallelism.pipeline_parallel_microbatch_size 1 --parallelism.context_parallel_degree 1");
  CHECK(megatron_arguments(sc, c).empty());  // Megatron-LM's own FSDP is not emitted
  c.spec = make_spec("zero1", std::nullopt, 8);
  CHECK(torchtitan_options(sc, c).empty());  // torchtitan has no ZeRO-1
  CHECK(megatron_arguments(sc, c) ==
        "--tensor-model-parallel-size 8 --sequence-parallel --pipeline-model-parallel-size 4 "
        "--num-layers-per-virtual-pipeline-stage 4 --context-parallel-size 1 --micro-batch-size 1 "
        "--global-batch-size 64 --use-distributed-optimizer");
}
