// planner recommend's search over the whole plan space (goal: >= 250,000 plans evaluated per
// second on one core; the 70B/1024-GPU recommendation well under a second), and the
// model-parallel search (tensor x pipeline x context x data) for a 405B model on 16,384 GPUs
// (goal: under a second).
// Run: build/release/bench/bench_planner
#include <benchmark/benchmark.h>

#include "planner/parallel_search.hpp"
#include "planner/search.hpp"

using namespace shardplan;

namespace {

planner::Scenario scenario(const char* model, const char* hw, int gpus, std::int64_t seq,
                           std::int64_t batch) {
  planner::Scenario sc;
  sc.model = documents::load_model(model);
  sc.hardware = documents::load_hardware(hw);
  sc.cluster = {gpus, 8};
  sc.job.seq_len = seq;
  sc.job.global_batch = batch;
  return sc;
}

void search(benchmark::State& state, const planner::Scenario& sc, bool exhaustive) {
  planner::SearchPins pins;
  pins.exhaustive = exhaustive;
  long simulated = 0, considered = 0;
  for (auto _ : state) {
    auto r = planner::search(sc, pins);
    simulated += r.plans_simulated;
    considered += r.plans_considered;
    benchmark::DoNotOptimize(r.ranked.data());
  }
  state.counters["plans_simulated/s"] =
      benchmark::Counter(static_cast<double>(simulated), benchmark::Counter::kIsRate);
  state.counters["plans_considered/s"] =
      benchmark::Counter(static_cast<double>(considered), benchmark::Counter::kIsRate);
}

// Llama 3.1 405B (the preset) on 16,384 H100s in nodes of 8, 2048 sequences of 8192 tokens,
// Megatron's recipe (as tests/planner/test_parallel_search.cpp's case).
planner::Scenario llama405b_16384_gpus() {
  planner::Scenario sc;
  sc.model = documents::load_model("llama-3.1-405b");
  sc.hardware = documents::load_hardware("h100-sxm5-80gb");
  sc.cluster = {16384, 8};
  sc.job.seq_len = 8192;
  sc.job.global_batch = 2048;
  sc.job.recipe = documents::Recipe::megatron;
  sc.job.loss = documents::LossImpl::fp32_inplace;
  return sc;
}

// The same job under torchtitan's recipe: its pipelines walked stage by stage (pipeline_walk.hpp).
planner::Scenario llama405b_16384_gpus_torchtitan() {
  planner::Scenario sc = llama405b_16384_gpus();
  sc.job.recipe = documents::Recipe::torchtitan;
  sc.job.loss = documents::recipe_traits(documents::Recipe::torchtitan).loss;
  return sc;
}

void parallel_search(benchmark::State& state, const planner::Scenario& sc) {
  long evaluated = 0, layouts = 0;
  for (auto _ : state) {
    auto s = planner::search_layouts(sc, 10);
    evaluated += s.evaluated;
    layouts += s.layouts;
    benchmark::DoNotOptimize(s.ranked.data());
  }
  state.counters["evaluations/s"] =
      benchmark::Counter(static_cast<double>(evaluated), benchmark::Counter::kIsRate);
  state.counters["layouts/run"] =
      benchmark::Counter(static_cast<double>(layouts), benchmark::Counter::kAvgIterations);
}

}  // namespace

BENCHMARK_CAPTURE(parallel_search, llama405b_h100_16384gpus, llama405b_16384_gpus())
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(parallel_search, llama405b_h100_16384gpus_torchtitan,
                  llama405b_16384_gpus_torchtitan())
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(search, llama70b_h100_1024gpus,
                  scenario("llama-2-70b", "h100-sxm5-80gb", 1024, 4096, 1024), false)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(search, llama7b_a100_8gpus,
                  scenario("llama-2-7b", "a100-sxm4-80gb", 8, 4096, 256), false)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(search, llama7b_a100_8gpus_exhaustive,
                  scenario("llama-2-7b", "a100-sxm4-80gb", 8, 4096, 256), true)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
