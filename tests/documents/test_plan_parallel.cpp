// The plan document's /parallel object: written for model-parallel plans only, read back, and
// every rejection of the reader (the key's pointer and the value).
#include <doctest/doctest.h>

#include "documents/plan.hpp"
#include "tests/test_support.hpp"

using shardplan::test::error_of;
using namespace shardplan::documents;
using nlohmann::json;

namespace {

// Llama-3-70B on 256 GPUs of 8 under torchtitan (whose trainer runs every dimension): tensor 8
// with sequence parallel, pipeline 4 (1F1B, 8 micro-batches of 1), so data parallel 256 / (8·4) = 8
// and 8 x 8 x 1 = 64 sequences, the global batch.
Plan llama70b_plan() {
  Plan p;
  p.model = load_model("llama-3-70b");
  p.job.recipe = Recipe::torchtitan;
  p.hardware = "h100-sxm5-80gb";
  p.cluster = {256, 8};
  p.job.seq_len = 8192;
  p.job.global_batch = 64;
  p.job.micro_batch = 1;
  p.spec = make_spec("fsdp-full", Flavour::fsdp2, 8);
  p.parallel.tensor_parallel = 8;
  p.parallel.sequence_parallel = true;
  p.parallel.pipeline_parallel = 4;
  p.parallel.micro_batches = 8;
  p.prediction.peak_bytes = 5e10;
  return p;
}

bool starts_with(const std::string& text, const std::string& head) {
  return text.rfind(head, 0) == 0;
}

std::string error_with(const std::string& key, const json& value) {
  json doc = plan_to_json(llama70b_plan());
  if (value.is_null())
    doc["parallel"].erase(key);
  else
    doc["parallel"][key] = value;
  return error_of([&] { plan_from_json(doc); });
}

}  // namespace

TEST_CASE("plan_parallel::a model-parallel plan carries its layout and reads back equal") {
  const json written = plan_to_json(llama70b_plan());
  CHECK(written["parallel"] == json{{"tensor", 8},
                                    {"sequence_parallel", true},
                                    {"async_tensor_parallel", false},
                                    {"pipeline", 4},
                                    {"schedule", "1f1b"},
                                    {"virtual_stages", 1},
                                    {"micro_batches", 8},
                                    {"context", 1},
                                    {"cp_rotate_method", "allgather"}});
  const Plan back = plan_from_json(written);
  CHECK(back.parallel.tensor_parallel == 8);
  CHECK(back.parallel.sequence_parallel);
  CHECK(back.parallel.pipeline_parallel == 4);
  CHECK(back.parallel.micro_batches == 8);
  CHECK(back.parallel.data_parallel(back.cluster.gpus) == 8);
  CHECK(plan_to_json(back) == written);
  // The interleaved schedule: 80 layers over 4 stages x 5 chunks = 4 blocks a chunk.
  Plan inter = llama70b_plan();
  inter.parallel.schedule = PipelineSchedule::interleaved_1f1b;
  inter.parallel.virtual_stages = 5;
  inter.parallel.context_parallel = 2;  // 8192 / (2·2) chunks; data parallel 4, micro-batches 16
  inter.parallel.micro_batches = 16;
  inter.parallel.cp_rotate = CpRotate::all_to_all;
  const json w2 = plan_to_json(inter);
  CHECK(w2["parallel"]["schedule"] == "interleaved-1f1b");
  CHECK(w2["parallel"]["cp_rotate_method"] == "alltoall");
  CHECK(plan_to_json(plan_from_json(w2)) == w2);
  // A plan written before the key reads as torch's default; a wrong name is refused.
  json older = written;
  older["parallel"].erase("cp_rotate_method");
  CHECK(plan_from_json(older).parallel.cp_rotate == CpRotate::all_gather);
  json wrong = written;
  wrong["parallel"]["cp_rotate_method"] = "ring";
  CHECK(error_of([&] { plan_from_json(wrong); }) ==
        "/parallel/cp_rotate_method: must be one of allgather, alltoall, got \"ring\"");
}

TEST_CASE("plan_parallel::a data-parallel plan has no parallel object, and all ones read back") {
  Plan p = llama70b_plan();
  p.parallel = ParallelLayout{};
  p.job.global_batch = 256;  // one sequence per GPU
  const json written = plan_to_json(p);
  CHECK_FALSE(written.contains("parallel"));
  CHECK(plan_from_json(written).parallel.trivial());
  json ones = written;
  ones["parallel"] = plan_parallel_to_json(ParallelLayout{});
  CHECK(plan_from_json(ones).parallel.trivial());
  // All ones still has to agree with the batch: 256 replicas x 2 micro-batches x 1 != 256.
  ones["parallel"]["micro_batches"] = 2;
  CHECK(error_of([&] { plan_from_json(ones); }) ==
        "/parallel: data parallel 256 x micro-batches 2 x micro-batch 1 = 512 sequences, not the "
        "global batch 256");
}

TEST_CASE("plan_parallel::rejections name the key and the value") {
  CHECK(error_with("tensor", 0) == "/parallel/tensor: must be >= 1, got 0");
  CHECK(error_with("pipeline", 2.5) == "/parallel/pipeline: must be an integer, got 2.5");
  CHECK(error_with("context", nullptr) == "/parallel/context: missing key");
  CHECK(error_with("micro_batches", -3) == "/parallel/micro_batches: must be >= 1, got -3");
  CHECK(error_with("virtual_stages", 2) ==
        "/parallel/virtual_stages: 2 needs \"schedule\": \"interleaved-1f1b\", got \"1f1b\"");
  CHECK(error_with("schedule", "zero-bubble") ==
        "/parallel/schedule: must be one of 1f1b, interleaved-1f1b, gpipe, got \"zero-bubble\"");
  CHECK(error_with("schedule", "interleaved-1f1b") ==
        "/parallel/virtual_stages: the interleaved-1f1b schedule needs >= 2, got 1");
  CHECK(error_with("expert", 2) == "/parallel/expert: unknown key");
  CHECK(starts_with(error_with("sequence_parallel", "yes"), "/parallel/sequence_parallel: "));
  json doc = plan_to_json(llama70b_plan());
  doc["parallel"]["tensor"] = 1;
  CHECK(error_of([&] { plan_from_json(doc); }) ==
        "/parallel/sequence_parallel: true needs \"tensor\" > 1, got 1");
  doc["parallel"]["sequence_parallel"] = false;
  doc["parallel"]["async_tensor_parallel"] = true;
  CHECK(error_of([&] { plan_from_json(doc); }) ==
        "/parallel/async_tensor_parallel: true needs \"tensor\" > 1, got 1");
  doc = plan_to_json(llama70b_plan());
  doc["parallel"] = json::array();
  CHECK(starts_with(error_of([&] { plan_from_json(doc); }), "/parallel: "));
}

TEST_CASE("plan_parallel::a layout the model, batch or cluster cannot run is rejected") {
  // 4 micro-batches of 1 over 8 replicas: 32 sequences, not 64.
  CHECK(error_with("micro_batches", 4) ==
        "/parallel: data parallel 8 x micro-batches 4 x micro-batch 1 = 32 sequences, not the "
        "global batch 64");
  // 256 GPUs over 8 x 3 (80 layers split 27, 27, 26 over the 3 stages).
  CHECK(error_with("pipeline", 3) ==
        "/parallel: 256 GPUs are not a multiple of tensor 8 x pipeline 3 x context 1 = 24");
  // Tensor parallel 16 leaves the 8-GPU node, and Llama-3-70B's 8 key/value heads do not split
  // 16 ways; data parallel 256 / (16·4) = 4, and 4 x 8 x 1 = 32 sequences.
  CHECK(
      error_with("tensor", 16) ==
      "/parallel: tensor parallel 16 is larger than a node of 8 GPUs: its all-reduces per layer "
      "would cross the inter-node links; 8 key/value heads do not divide over tensor parallel 16; "
      "data parallel 4 x micro-batches 8 x micro-batch 1 = 32 sequences, not the global batch 64");
}

// A dimension the recipe's trainer does not run (documents/recipe.cpp, RecipeTraits::offers_*):
// transformers' Trainer has no pipeline and no sequence parallelism, llm-foundry's Composer no
// tensor (of the kind modeled), pipeline or context parallelism.
TEST_CASE("plan_parallel::a dimension the recipe's trainer does not run is rejected, naming those "
          "that do") {
  json doc = plan_to_json(llama70b_plan());
  doc["job"]["recipe"] = "hf";
  CHECK(error_of([&] { plan_from_json(doc); }) ==
        "/parallel: the hf recipe's trainer runs no sequence parallelism (asked for 8); the "
        "recipes that do: torchtitan, megatron, executor; the hf recipe's trainer runs no "
        "pipeline (asked for 4); the recipes that do: torchtitan, megatron, deepspeed, executor");
  doc["parallel"]["sequence_parallel"] = false;
  doc["parallel"]["pipeline"] = 1;
  doc["parallel"]["micro_batches"] = 2;
  doc["parallel"]["context"] = 4;  // 256 / (8·4) = 8 replicas x 2 micro-batches x 1 = 16
  doc["job"]["global_batch"] = 16;
  CHECK(plan_from_json(doc).parallel.context_parallel == 4);  // hf runs TP and CP
  doc["job"]["recipe"] = "llm-foundry";
  CHECK(error_of([&] { plan_from_json(doc); }) ==
        "/parallel: the llm-foundry recipe's trainer runs no tensor parallelism (asked for 8); "
        "the recipes that do: hf, torchtitan, megatron, deepspeed, executor; the llm-foundry "
        "recipe's trainer runs no context parallelism (asked for 4); the recipes that do: hf, "
        "torchtitan, megatron, executor");
}
