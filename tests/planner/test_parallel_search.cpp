// The model-parallel search: what it ranks at up to 16,384 GPUs (its speed:
// bench/bench_planner.cpp; the launch options: test_parallel_emit.cpp).
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "planner/emit_parallel.hpp"
#include "planner/parallel_search.hpp"
#include "tests/test_support.hpp"

using shardplan::test::contains;
using namespace shardplan::planner;
using namespace shardplan::costmodel;
using namespace shardplan::documents;

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

// The same degrees and schedule (micro-batches follow the micro-batch).
bool same_shape(const ParallelLayout& a, const ParallelLayout& b) {
  return a.tensor_parallel == b.tensor_parallel && a.sequence_parallel == b.sequence_parallel &&
         a.pipeline_parallel == b.pipeline_parallel && a.schedule == b.schedule &&
         a.virtual_stages == b.virtual_stages && a.context_parallel == b.context_parallel;
}

}  // namespace

TEST_CASE("parallel_search::Llama-3-70B on 256 GPUs: FSDP alone fits only with full recompute, "
          "model parallelism wins") {
  const auto sc = scenario(load_model("llama-3-70b"), 256, 256);
  const auto s = search_layouts(sc, 10);
  REQUIRE(s.best_data_parallel);
  // A whole 8192-token sequence's activations per GPU do not fit; every block's input alone does.
  CHECK(s.best_data_parallel->fits);
  CHECK(s.best_data_parallel->job.checkpointing == Checkpointing::full);
  for (const auto& c : s.ranked)
    if (c.layout.trivial()) CHECK(c.job.checkpointing == Checkpointing::full);
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

TEST_CASE(
    "parallel_search::405B on 16,384 GPUs: the batch limit named, model-parallel plans found") {
  // Its speed (under a second) is bench/bench_planner.cpp's parallel_search case.
  const auto sc = scenario(load_model("llama-3.1-405b"), 16384, 2048);
  const auto s = search_layouts(sc, 0);
  CHECK_FALSE(s.ranked.empty());
  // 2048 sequences cannot spread over 16,384 GPUs by data parallelism alone: the batch limit.
  CHECK_FALSE(s.best_data_parallel);
  CHECK(contains(layout_search_table(sc, s, 3),
                 "the global batch of 2048 sequences does not divide over 16384 GPUs"));
}

// A micro-batch the job names is the search's only one: Llama-3-70B, 256 sequences over 256 GPUs,
// each layout's replicas would take 1, 2, 4... sequences at a time.
TEST_CASE("parallel_search::the job's micro-batch is kept, not searched") {
  auto sc = scenario(load_model("llama-3-70b"), 256, 256);
  sc.job.micro_batch = 1;
  const auto s = search_layouts(sc, 0);
  REQUIRE_FALSE(s.ranked.empty());
  for (const auto& c : s.ranked) CHECK(c.job.micro_batch == 1);
  sc.job.micro_batch = 2;
  const auto two = search_layouts(sc, 0);
  REQUIRE_FALSE(two.ranked.empty());
  for (const auto& c : two.ranked) CHECK(c.job.micro_batch == 2);
}

TEST_CASE("parallel_search::checkpointing is searched, more recompute only above what fitted") {
  const auto sc = scenario(load_model("llama-3-70b"), 256, 256);
  const auto s = search_layouts(sc, 10);
  bool full = false;
  for (const auto& c : s.ranked) {
    if (c.job.checkpointing != Checkpointing::full) continue;
    full = true;
    // The same layout and strategy without recompute fits no micro-batch this large.
    for (const auto& o : s.ranked)
      if (o.job.checkpointing == Checkpointing::none && o.spec.strategy == c.spec.strategy &&
          same_shape(o.layout, c.layout))
        CHECK(o.job.micro_batch < c.job.micro_batch);
  }
  CHECK(full);
  // A named mode is the only one tried.
  auto pinned = sc;
  pinned.checkpointing_named = true;
  pinned.job.checkpointing = Checkpointing::full;
  for (const auto& c : search_layouts(pinned, 10).ranked)
    CHECK(c.job.checkpointing == Checkpointing::full);
}

// Llama-3-70B (h 8192, MLP 28672, 80 blocks) on 256 GPUs, 256 sequences of 8192 tokens: one
// sequence per GPU is the batch limit. The activation wall, a lower bound by hand: without
// recompute each block keeps at least its input (bf16, 2·s·h = 134,217,728 bytes) and SwiGLU's gate
// and up projections for the product's backward (2 x 2·s·i = 939,524,096 bytes): 80 x
// 1,073,741,824 = 85.9e9 bytes, beyond an 80 GB GPU.
TEST_CASE("parallel_search::where FSDP alone stops on Llama-3-70B and 256 GPUs") {
  const auto sc = scenario(load_model("llama-3-70b"), 256, 256);
  const auto s = search_layouts(sc, 10);
  const auto f = fsdp_limits(sc, s);
  CHECK(f.sequences_per_gpu == 1.0);
  CHECK(f.batch_divides);
  CHECK(f.no_recompute_activation_bytes >= 80 * 1'073'741'824.0);
  CHECK(f.no_recompute_peak_bytes > sc.usable_bytes());
  REQUIRE(s.best_data_parallel);
  CHECK(f.best_step_s == s.best_data_parallel->result.step.step_s);
  CHECK(f.best_exposed_s > 0);
  CHECK(f.best_exposed_s < f.best_step_s);
  CHECK(contains(layout_search_table(sc, s, 3),
                 "where FSDP alone stops: batch limit 1 sequences per GPU (256 over 256 GPUs); "
                 "activation wall: micro-batch 1 without recompute peaks at "));
  // 2048 sequences over 16,384 GPUs: an eighth of a sequence each.
  const auto big = scenario(load_model("llama-3-70b"), 16384, 2048);
  const auto fb = fsdp_limits(big, LayoutSearch{});
  CHECK(fb.sequences_per_gpu == 0.125);
  CHECK_FALSE(fb.batch_divides);
  CHECK(fb.no_recompute_peak_bytes == 0);
}

// torchtitan's pipelines are walked stage by stage; the search walks only those whose bound
// (parallel_step_bound) can still beat the plans it keeps: the kept plans are the full search's.
TEST_CASE("parallel_search::the plans kept are those of the search that walks every layout") {
  auto sc = scenario(load_model("llama-3-8b"), 64, 64);
  sc.job.recipe = Recipe::torchtitan;
  sc.job.loss = recipe_traits(Recipe::torchtitan).loss;
  const auto all = search_layouts(sc, 0);
  const auto kept = search_layouts(sc, 5);
  CHECK(all.outranked == 0);
  CHECK(kept.outranked > 0);
  CHECK(kept.evaluated < all.evaluated);
  REQUIRE(all.ranked.size() >= 5);
  REQUIRE(kept.ranked.size() >= 5);
  for (std::size_t i = 0; i < 5; ++i) {
    CAPTURE(i);
    CHECK(same_shape(kept.ranked[i].layout, all.ranked[i].layout));
    CHECK(kept.ranked[i].job.micro_batch == all.ranked[i].job.micro_batch);
    CHECK(kept.ranked[i].spec.strategy == all.ranked[i].spec.strategy);
    CHECK(kept.ranked[i].result.step.step_s == all.ranked[i].result.step.step_s);
  }
  CHECK(contains(layout_search_table(sc, kept, 5), "pipelined candidates not walked"));
}

// Under --emit for a framework the plans that count are those it can run: the one kept is the
// full search's fastest that torchtitan expresses (emit_parallel.hpp, cannot_express).
TEST_CASE("parallel_search::under --emit the fastest plan the framework runs is the one kept") {
  auto sc = scenario(load_model("llama-3-8b"), 64, 64);
  sc.job.recipe = Recipe::torchtitan;
  sc.job.loss = recipe_traits(Recipe::torchtitan).loss;
  const auto runs = [&](const LayoutCandidate& c) {
    return cannot_express(ParallelFramework::torchtitan, sc, c).empty();
  };
  const auto all = search_layouts(sc, 0);
  const auto kept = search_layouts(sc, 1, runs);
  CHECK(kept.outranked > 0);
  const auto first = std::find_if(all.ranked.begin(), all.ranked.end(), runs);
  REQUIRE(first != all.ranked.end());
  std::vector<std::string> notes;
  const auto& chosen =
      expressible_layout(ParallelFramework::torchtitan, "torchtitan", sc, kept, notes);
  CHECK(same_shape(chosen.layout, first->layout));
  CHECK(chosen.spec.strategy == first->spec.strategy);
  CHECK(chosen.job.micro_batch == first->job.micro_batch);
  CHECK(chosen.result.step.step_s == first->result.step.step_s);
}

// The search offers a recipe's pipeline only the schedules its code has (RecipeTraits::schedules):
// DeepSpeed's PipelineEngine runs its 1F1B TrainSchedule only; Megatron-LM also interleaves, here
// with 2, 4 or 5 chunks of 20 blocks per stage (80 blocks over 4 stages; at most 8 chunks). Every
// candidate DeepSpeed's search ranks is 1F1B.
TEST_CASE("parallel_search::a recipe's pipelines run only the schedules its code has") {
  using Variants = std::vector<std::pair<PipelineSchedule, int>>;
  const Variants one_f_one_b = {{PipelineSchedule::one_f_one_b, 1}};
  CHECK(pipeline_variants(4, 80, recipe_traits(Recipe::deepspeed)) == one_f_one_b);
  CHECK(pipeline_variants(4, 80, recipe_traits(Recipe::megatron)) ==
        Variants{{PipelineSchedule::one_f_one_b, 1},
                 {PipelineSchedule::interleaved_1f1b, 2},
                 {PipelineSchedule::interleaved_1f1b, 4},
                 {PipelineSchedule::interleaved_1f1b, 5}});
  CHECK(pipeline_variants(1, 80, recipe_traits(Recipe::megatron)) == one_f_one_b);
  auto sc = scenario(load_model("llama-3-70b"), 256, 256);
  sc.job.recipe = Recipe::deepspeed;
  sc.job.loss = LossImpl::upcast;
  const auto s = search_layouts(sc, 0);
  REQUIRE_FALSE(s.ranked.empty());
  for (const auto& c : s.ranked) CHECK(c.layout.schedule == PipelineSchedule::one_f_one_b);
}
