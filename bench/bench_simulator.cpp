// Full step simulations per second (issue goal: >= 100,000/s on one core for llama-2-70b on
// 1024 GPUs, 128 nodes). Run: build/release/bench/bench_costmodel
#include <benchmark/benchmark.h>

#include "costmodel/simulator.hpp"

using namespace shardplan::costmodel;

namespace {

void simulate(benchmark::State& state, const char* strategy) {
  const auto model = load_model("llama-2-70b");
  const auto hw = load_hardware("h100-sxm5-80gb");
  StepInput in;
  in.model = &model;
  in.hardware = &hw;
  in.cluster = {1024, 8};
  in.job.seq_len = 4096;
  in.job.global_batch = 1024;
  in.job.micro_batch = 1;
  in.spec = make_spec(strategy, std::nullopt, 8);
  for (auto _ : state) {
    auto r = simulate_step(in);
    benchmark::DoNotOptimize(r.step_s);
  }
  state.counters["simulations/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

}  // namespace

BENCHMARK_CAPTURE(simulate, ddp, "ddp");
BENCHMARK_CAPTURE(simulate, zero2, "zero2");
BENCHMARK_CAPTURE(simulate, zero3, "zero3");
BENCHMARK_CAPTURE(simulate, fsdp_full, "fsdp-full");
BENCHMARK_CAPTURE(simulate, hsdp, "hsdp");
BENCHMARK_MAIN();
