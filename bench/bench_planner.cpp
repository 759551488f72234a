// planner recommend's search over the whole plan space (issue goal: >= 250,000 plans evaluated per
// second on one core; the 70B/1024-GPU recommendation well under a second).
// Run: build/release/bench/bench_planner
#include <benchmark/benchmark.h>

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

}  // namespace

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
