// Full step simulations per second (issue goal: >= 100,000/s on one core for llama-2-70b on
// 1024 GPUs, 128 nodes), and a walk's time against the model's blocks.
// Run: build/release/bench/bench_costmodel
#include <benchmark/benchmark.h>

#include "costmodel/simulator.hpp"

using namespace shardplan::costmodel;
using namespace shardplan::documents;

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

// One step of 1e11 parameters in L blocks, FSDP's SHARD_GRAD_OP on 1024 GPUs of 2 per node, 2
// tokens per sequence: a walk of 2L + 2 units and their events, which must grow linearly in L
// (the Complexity line: "O(N)" with a flat per-block time), not with L^2.
void many_layers(benchmark::State& state) {
  const auto model = model_from_param_count(1e11, state.range(0));
  const auto hw = load_hardware("a100-sxm4-80gb");
  StepInput in;
  in.model = &model;
  in.hardware = &hw;
  in.cluster = {1024, 2};
  in.job.seq_len = 2;
  in.job.global_batch = 8192;
  in.job.micro_batch = 8;
  in.job.precision = Precision::fp32;
  in.spec = make_spec("fsdp-grad-op", std::nullopt, 1024);
  for (auto _ : state) {
    auto r = simulate_step(in);
    benchmark::DoNotOptimize(r.step_s);
  }
  state.SetComplexityN(state.range(0));
}

}  // namespace

BENCHMARK(many_layers)->RangeMultiplier(4)->Range(1 << 10, 1 << 16)->Complexity();
BENCHMARK_CAPTURE(simulate, ddp, "ddp");
BENCHMARK_CAPTURE(simulate, zero2, "zero2");
BENCHMARK_CAPTURE(simulate, zero3, "zero3");
BENCHMARK_CAPTURE(simulate, fsdp_full, "fsdp-full");
BENCHMARK_CAPTURE(simulate, hsdp, "hsdp");
BENCHMARK_MAIN();
