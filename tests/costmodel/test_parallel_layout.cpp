#include <doctest/doctest.h>

#include <algorithm>

#include "core/json_reader.hpp"
#include "costmodel/parallel_layout.hpp"
#include "tests/test_support.hpp"

using shardplan::test::contains;
using shardplan::test::error_of;
using namespace shardplan::costmodel;
using namespace shardplan::documents;
using nlohmann::json;

namespace {

// Whether one of the reasons holds `part`.
bool says(const std::vector<std::string>& reasons, const std::string& part) {
  return std::any_of(reasons.begin(), reasons.end(),
                     [&](const std::string& r) { return contains(r, part); });
}

// Under torchtitan, whose trainer runs every dimension.
TrainingJob job_of(std::int64_t seq, std::int64_t global, std::int64_t micro) {
  TrainingJob j;
  j.recipe = Recipe::torchtitan;
  j.seq_len = seq;
  j.global_batch = global;
  j.micro_batch = micro;
  return j;
}

}  // namespace

TEST_CASE("parallel_layout::data-parallel size and groups in mesh order pp, dp, cp, tp") {
  ParallelLayout l;
  l.tensor_parallel = 8;
  l.pipeline_parallel = 4;
  l.micro_batches = 8;
  const Cluster c{256, 8};
  // 256 / (8·4·1) = 8 data-parallel replicas.
  CHECK(l.data_parallel(256) == 8);
  CHECK(l.data_parallel(100) == 0);
  const auto g = layout_groups(l, c);
  CHECK(g.tensor.ranks == 8);
  CHECK(g.tensor.ranks_per_node == 8);  // TP fills the node
  CHECK(g.tensor.tier() == Tier::intra_node);
  CHECK(g.data.ranks == 8);
  CHECK(g.data.ranks_per_node == 1);  // stride 8 = a node: one DP rank per node
  CHECK(g.pipeline.ranks == 4);
  CHECK(g.pipeline_crosses_nodes);  // neighbours are 8·8 = 64 ranks apart
  // t = 2, c = 2 on 8-GPU nodes, d = 2, p = 1: the CP group has stride 2 (2 per node), DP stride 4.
  ParallelLayout l2;
  l2.tensor_parallel = 2;
  l2.context_parallel = 2;
  const auto g2 = layout_groups(l2, Cluster{8, 8});
  CHECK(g2.context.ranks_per_node == 2);
  CHECK(g2.data.ranks == 2);
  CHECK(g2.data.ranks_per_node == 2);
  CHECK_FALSE(g2.pipeline_crosses_nodes);
}

TEST_CASE("parallel_layout::impossible combinations are named with their numbers") {
  const auto m = load_model("llama-3-70b");  // 64 heads, 8 kv heads, 80 layers, MLP 28672
  const Cluster c{256, 8};
  ParallelLayout ok;
  ok.tensor_parallel = 8;
  ok.pipeline_parallel = 4;
  ok.micro_batches = 8;
  CHECK(layout_problems(ok, m, job_of(8192, 64, 1), c).empty());  // d = 8: 8·8·1 = 64

  ParallelLayout bad = ok;
  bad.tensor_parallel = 16;  // larger than a node; kv heads 8 do not divide
  auto r = layout_problems(bad, m, job_of(8192, 64, 1), Cluster{256, 8});
  CHECK(says(r, "tensor parallel 16 is larger than a node of 8 GPUs"));
  CHECK(says(r, "8 key/value heads do not divide over tensor parallel 16"));

  bad = ok;
  bad.pipeline_parallel = 3;  // 80 layers; 256 GPUs not a multiple of 24
  auto megatron = job_of(8192, 64, 1);
  megatron.recipe = Recipe::megatron;  // splits evenly; torchtitan's split makes 27, 27, 26
  r = layout_problems(bad, m, megatron, c);
  CHECK(says(r, "Megatron-LM splits 80 layers evenly over pipeline 3 x virtual stages 1 = 3: "
                "they do not divide"));
  CHECK(says(r, "256 GPUs are not a multiple of tensor 8 x pipeline 3 x context 1 = 24"));

  bad = ok;
  bad.schedule = PipelineSchedule::interleaved_1f1b;
  bad.virtual_stages = 3;  // 4·3 = 12 does not divide 80
  bad.micro_batches = 6;   // not a multiple of 4
  r = layout_problems(bad, m, job_of(8192, 48, 1), c);
  CHECK(says(r, "micro-batches (6) to be a multiple of pipeline parallel (4)"));

  bad = ok;
  bad.virtual_stages = 2;  // 1f1b has no virtual stages
  CHECK(says(layout_problems(bad, m, job_of(8192, 64, 1), c),
             "virtual stages 2 need the interleaved-1f1b"));

  bad = ok;
  bad.pipeline_parallel = 1;
  bad.context_parallel = 4;  // 8190 is not a multiple of 2·4
  bad.micro_batches = 1;
  r = layout_problems(bad, m, job_of(8190, 8, 1), c);
  CHECK(says(r, "sequence 8190 does not divide into 2 x context parallel 4 = 8 chunks"));

  bad = ok;
  bad.tensor_parallel = 3;  // 64 heads, 28672 MLP width: not divisible; 3 does not divide the node
  bad.pipeline_parallel = 1;
  r = layout_problems(bad, m, job_of(8192, 64, 1), Cluster{192, 8});
  CHECK(says(r, "64 attention heads do not divide over tensor parallel 3"));
  CHECK(says(r, "tensor parallel 3 does not divide a node of 8 GPUs"));

  // The batch: 8 replicas x 8 micro-batches x micro-batch 2 = 128 sequences, not 64.
  CHECK(says(layout_problems(ok, m, job_of(8192, 64, 2), c),
             "data parallel 8 x micro-batches 8 x micro-batch 2 = 128 sequences, not the global "
             "batch 64"));

  bad = ok;
  bad.tensor_parallel = 1;
  bad.pipeline_parallel = 1;
  bad.sequence_parallel = true;
  CHECK(says(layout_problems(bad, m, job_of(8192, 2048, 1), c), "it needs tensor parallel > 1"));

  bad = ok;
  bad.tensor_parallel = 0;  // never a division by zero: the degrees are checked first
  CHECK(
      says(layout_problems(bad, m, job_of(8192, 64, 1), c), "degrees must be >= 1, got tensor 0"));
}

TEST_CASE("parallel_layout::json round trip and rejections name the field and value") {
  ParallelLayout l;
  l.tensor_parallel = 4;
  l.sequence_parallel = true;
  l.pipeline_parallel = 8;
  l.schedule = PipelineSchedule::interleaved_1f1b;
  l.virtual_stages = 2;
  l.micro_batches = 16;
  l.context_parallel = 2;
  const auto back = layout_from_json(layout_to_json(l), "/parallelism");
  CHECK(back.tensor_parallel == 4);
  CHECK(back.sequence_parallel);
  CHECK(back.pipeline_parallel == 8);
  CHECK(back.schedule == PipelineSchedule::interleaved_1f1b);
  CHECK(back.virtual_stages == 2);
  CHECK(back.micro_batches == 16);
  CHECK(back.context_parallel == 2);
  CHECK(layout_from_json(json::object(), "").trivial());

  auto with = [](json patch) { return error_of([&] { layout_from_json(patch, "/parallelism"); }); };
  CHECK(with({{"tensor_parallel", 0}}) == "/parallelism/tensor_parallel: must be >= 1, got 0");
  CHECK(with({{"pipeline_parallel", 2.5}}) ==
        "/parallelism/pipeline_parallel: must be an integer, got 2.5");
  CHECK(with({{"schedule", "zero-bubble"}}) ==
        "/parallelism/schedule: must be one of 1f1b, interleaved-1f1b, gpipe, got \"zero-bubble\"");
  CHECK(with({{"sequence_parallel", "yes"}}) ==
        "/parallelism/sequence_parallel: must be true or false, got \"yes\"");
  CHECK(with({{"tensor_paralel", 2}}) == "/parallelism/tensor_paralel: unknown key");
  CHECK(with({{"virtual_stages", 2}}) == "/parallelism/virtual_stages: 2 virtual stages need "
                                         "\"schedule\": \"interleaved-1f1b\", got \"1f1b\"");
  CHECK(with({{"sequence_parallel", true}}) ==
        "/parallelism/sequence_parallel: true needs tensor_parallel > 1, got 1");
  CHECK(with({{"async_tensor_parallel", true}}) ==
        "/parallelism/async_tensor_parallel: true needs tensor_parallel > 1, got 1");
  CHECK(error_of([] { layout_from_json(json::array(), "/parallelism"); }) ==
        "/parallelism: must be an object, got []");
}

TEST_CASE("parallel_layout::uneven pipeline splits as torchtitan makes them") {
  // torchtitan 0.3.0 (distributed/pipeline_parallel.py, _generate_llm_fqn_per_model_part): the
  // L blocks plus first + last "effective layers" over the p·v parts, the first
  // (L + first + last) mod (p·v) parts one more, the first part giving up `first` blocks to the
  // embeddings and the last `last` to the head. Worked by hand:
  ParallelLayout l;
  l.pipeline_parallel = 8;
  l.first_stage_less_layers = l.last_stage_less_layers = 1;
  // Llama-3.1-405B's 126 blocks: 128 effective layers, 16 a part: 15, 16 x 6, 15.
  CHECK(pipeline_parts(l, 126) == std::vector<std::int64_t>{15, 16, 16, 16, 16, 16, 16, 15});
  // 80 blocks over 4 stages: 82 = 20·4 + 2, parts 21, 21, 20, 20 less the ends: 20, 21, 20, 19.
  l.pipeline_parallel = 4;
  CHECK(pipeline_parts(l, 80) == std::vector<std::int64_t>{20, 21, 20, 19});
  // Interleaved, 2 chunks a stage: 82 over 8 parts, 10 each and 2 more: 10, 11, 10, ..., 9;
  // stage s holds parts s and s + 4.
  l.schedule = PipelineSchedule::interleaved_1f1b;
  l.virtual_stages = 2;
  CHECK(pipeline_parts(l, 80) == std::vector<std::int64_t>{10, 11, 10, 10, 10, 10, 10, 9});
  CHECK(stage_blocks(l, 80, 0) == 20);
  CHECK(stage_blocks(l, 80, 1) == 21);
  CHECK(stage_blocks(l, 80, 3) == 19);
  CHECK(stage_first_block(l, 80, 2) == 21);  // after parts 0 and 1
  // Without the ends counted, an even split is the old one.
  ParallelLayout even;
  even.pipeline_parallel = 4;
  CHECK(pipeline_parts(even, 80) == std::vector<std::int64_t>{20, 20, 20, 20});
  // torchtitan's default for its own recipe only.
  ParallelLayout titan = even;
  apply_recipe_split(titan, Recipe::torchtitan);
  CHECK(titan.first_stage_less_layers == 1);
  ParallelLayout mega = even;
  apply_recipe_split(mega, Recipe::megatron);
  CHECK(mega.last_stage_less_layers == 0);
}

TEST_CASE("parallel_layout::an impossible split is named") {
  const auto m = load_model("llama-3-70b");  // 80 layers
  const Cluster c{256, 8};
  ParallelLayout l;
  l.tensor_parallel = 8;
  l.pipeline_parallel = 4;
  l.micro_batches = 8;
  l.first_stage_less_layers = 30;  // more than a part's 20 (+ 2) blocks
  CHECK(says(layout_problems(l, m, job_of(8192, 64, 1), c),
             "80 layers (+ 30 for the embeddings, + 0 for the head) leave a model part of "
             "pipeline 4 x virtual stages 1 = 4 without blocks"));
  l.first_stage_less_layers = 1;
  l.pipeline_parallel = 1;
  l.micro_batches = 1;
  CHECK(says(layout_problems(l, m, job_of(8192, 32, 1), c),
             "first and last stage less layers (1 and 0) need pipeline parallel > 1"));
  // Megatron-LM with the embeddings and the loss counted: 82 does not divide over 4.
  l.pipeline_parallel = 4;
  l.micro_batches = 8;
  l.last_stage_less_layers = 1;
  auto j = job_of(8192, 64, 1);
  j.recipe = Recipe::megatron;
  CHECK(says(layout_problems(l, m, j, c),
             "Megatron-LM splits 80 layers (+ 1 for the embeddings, + 1 for the loss) evenly over "
             "pipeline 4 x virtual stages 1 = 4: they do not divide"));
}
