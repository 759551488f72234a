// The model and the sharding engine on the CUDA backend (kernels/cuda/cuda_backend.hpp) against
// the CPU backend, which is the reference (its kernels are checked against finite differences in
// test_gpt_model.cpp): the loss and every unit's gradients of a forward and backward, with eager
// and flash attention and with full recompute; then three optimizer steps of the engine under every
// strategy on one GPU. Skipped without a CUDA device (gpu_test_main.cpp).
//
// Tolerances. The GPU side runs its GEMMs in full fp32 here (TF32 off), so both sides compute in
// fp32 and differ only in the order of their sums (cuBLAS's blocking, warp reductions, atomics):
// a sum of k terms then differs by about k·u·Σ|terms| with u = 2⁻²⁴ ≈ 6e-8. Over the tiny models'
// forward and backward (k ≤ a few hundred, a dozen kernels in a chain) that is ≤ 1e-5 of the
// values' scale, so: the loss within kLoss relative, each unit's gradients within kGrad of the
// unit's largest gradient. A wrong index or a lost accumulation moves them by O(1) of that scale.
// After AdamW steps an element whose gradient is rounding noise may step either way (AdamW's
// update is ≈ ±lr whatever the gradient's size), so later losses get kLossAfterSteps.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "engine_fixture.hpp"
#include "executor/synthetic_data.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/device_memory.hpp"
#if SHARDPLAN_HAVE_NCCL
#include "comm/nccl_communicator.hpp"
#endif

using namespace shardplan;
using namespace shardplan::executor;
using namespace shardplan::kernels;
using namespace shardplan::executor::testing;
using documents::Flavour;

namespace {

constexpr double kLoss = 1e-5;
constexpr double kGrad = 1e-4;
constexpr double kLossAfterSteps = 1e-3;

// One GPU: its memory, the backend on it (full fp32 GEMMs), an allocator over that memory.
struct Gpu {
  kernels::cuda::DeviceMemory memory;
  kernels::cuda::CudaBackend<float> backend{memory, false};
  TrackedAllocator allocator{TrackedAllocator::kUnlimited, &memory};
};

// Models whose head_dim (16) the flash kernels take: Llama-like with GQA and SwiGLU, GPT-2-like
// with LayerNorm, biases, learned positions and a tied head.
documents::ModelSpec flash_llama() {
  return scale_down(documents::load_model("llama-3-8b"), {.layers = 2,
                                                          .hidden = 64,
                                                          .heads = 4,
                                                          .kv_heads = 2,
                                                          .head_dim = 16,
                                                          .intermediate = 96,
                                                          .vocab = 50,
                                                          .max_positions = 64});
}
documents::ModelSpec flash_gpt2() {
  return scale_down(documents::load_model("gpt2"), {.layers = 2,
                                                    .hidden = 64,
                                                    .heads = 4,
                                                    .intermediate = 128,
                                                    .vocab = 50,
                                                    .max_positions = 32});
}

struct Result {
  double loss = 0;
  std::vector<std::vector<float>> grads;  // per unit
};

// The CPU model: parameters initialised and perturbed as the gradient check does.
struct Reference {
  TrackedAllocator allocator;
  WholeModel<float> model;
  TokenBatch batch;
  Result result;
  Reference(const documents::ModelSpec& spec, BatchShape shape, Checkpointing checkpointing)
      : model(spec, allocator, 5) {
    model.perturb(6, 0.1);
    batch = synthetic_batch(allocator, 7, shape, spec.vocab);
    result.loss = model.run(batch.inputs.span(), batch.targets.span(), shape, checkpointing, true);
    for (auto& g : model.grads) result.grads.emplace_back(g.data(), g.data() + g.size());
  }
};

// The same forward and backward on the GPU from the reference's parameters and tokens.
Result run_on_gpu(const Reference& ref, const documents::ModelSpec& spec, BatchShape shape,
                  Checkpointing checkpointing, bool flash) {
  Gpu gpu;
  ModelOptions options;
  options.flash_attention = flash;
  GptModel<float> model(spec, gpu.allocator, options, &gpu.backend);
  const auto bytes = [](std::int64_t n, std::size_t size) {
    return n * static_cast<std::int64_t>(size);
  };
  std::vector<Buffer> p, g;
  for (const auto& host : ref.model.params) {
    p.push_back(
        gpu.allocator.allocate_uninitialized<float>(MemoryCategory::parameters, host.size()));
    gpu.memory.write(p.back().data(), host.data(), bytes(host.size(), sizeof(float)));
    g.push_back(gpu.allocator.allocate<float>(MemoryCategory::gradients, host.size()));
  }
  auto upload_tokens = [&](const TrackedBuffer<std::int32_t>& host) {
    auto d = gpu.allocator.allocate_uninitialized<std::int32_t>(MemoryCategory::activations,
                                                                host.size());
    gpu.memory.write(d.data(), host.data(), bytes(host.size(), sizeof(std::int32_t)));
    return d;
  };
  const auto tokens = upload_tokens(ref.batch.inputs);
  const auto targets = upload_tokens(ref.batch.targets);
  const std::span<const std::int32_t> in(tokens.data(), static_cast<std::size_t>(tokens.size()));
  const std::span<const std::int32_t> out(targets.data(), static_cast<std::size_t>(targets.size()));

  const double loss = forward_backward(model, p, g, in, out, shape, checkpointing, true);
  gpu.backend.synchronize();

  Result r;
  r.loss = loss;
  for (const auto& d : g) {
    r.grads.emplace_back(static_cast<std::size_t>(d.size()));
    gpu.memory.read(r.grads.back().data(), d.data(), bytes(d.size(), sizeof(float)));
  }
  return r;
}

void check_close(const Result& got, const Result& want) {
  CHECK(std::abs(got.loss - want.loss) <= kLoss * std::abs(want.loss));
  REQUIRE(got.grads.size() == want.grads.size());
  for (std::size_t u = 0; u < want.grads.size(); ++u) {
    CAPTURE(u);
    double scale = 0, worst = 0;
    for (std::size_t i = 0; i < want.grads[u].size(); ++i) {
      scale = std::max(scale, static_cast<double>(std::abs(want.grads[u][i])));
      worst = std::max(worst, static_cast<double>(std::abs(got.grads[u][i] - want.grads[u][i])));
    }
    CHECK(scale > 0);
    CHECK(worst <= kGrad * scale);
  }
}

// The engine on the GPU with a world of one (its collectives are copies: exact on one rank), in
// the compute type S of the options' precision: float (full fp32 GEMMs) or bf16 (cublasGemmEx,
// fp32 accumulation).
template <class S> EngineRun run_engine_on_gpu(EngineOptions options, int steps) {
  kernels::cuda::DeviceMemory memory;
  kernels::cuda::CudaBackend<S> backend{memory, false};
  TrackedAllocator allocator{TrackedAllocator::kUnlimited, &memory};
  if constexpr (std::is_same_v<S, float>)
    options.backend = &backend;
  else
    options.backend_bf16 = &backend;
  StandInCommunicator self(0, 1, &memory);
  EngineRun r;
  {
    ShardingEngine engine(options, allocator, {&self, &self, nullptr, true, nullptr});
    for (int k = 0; k < steps; ++k) r.losses.push_back(engine.step().loss);
    for (std::int64_t u = 0; u < engine.layout().unit_count(); ++u)
      r.params.push_back(engine.full_parameters(u));
  }
  r.peak_bytes = allocator.peak_bytes();
  return r;
}

#if SHARDPLAN_HAVE_NCCL
// The engine on the GPU with real NCCL collectives on one rank: the world, its all-gathers and its
// reductions are three communicators, each a stream of its own (as a multi-GPU run's), so every
// wait and record_use of the engine orders real kernels on real streams.
template <class S> EngineRun run_engine_on_gpu_nccl(EngineOptions options, int steps) {
  auto world = comm::NcclCommunicator::create_alone(0);
  auto shard = world->split(0, 0);
  auto reduce = world->split(0, 0);
  kernels::cuda::DeviceMemory memory;
  kernels::cuda::CudaBackend<S> backend{memory, false};
  TrackedAllocator allocator{TrackedAllocator::kUnlimited, &memory};
  if constexpr (std::is_same_v<S, float>)
    options.backend = &backend;
  else
    options.backend_bf16 = &backend;
  EngineRun r;
  {
    ShardingEngine engine(options, allocator,
                          {world.get(), shard.get(), nullptr, false, reduce.get()});
    for (int k = 0; k < steps; ++k) r.losses.push_back(engine.step().loss);
    for (std::int64_t u = 0; u < engine.layout().unit_count(); ++u)
      r.params.push_back(engine.full_parameters(u));
  }
  r.peak_bytes = allocator.peak_bytes();
  return r;
}
#endif

}  // namespace

#if SHARDPLAN_HAVE_NCCL
TEST_CASE("cuda::every strategy on NCCL's own streams trains as the CPU engine") {
  // One rank: NCCL's collectives are copies on their streams, so the values are the stand-in's
  // and the CPU engine's; only the ordering differs, and a missing wait shows as a wrong value.
  for (const auto& model : {tiny_llama(), tiny_gpt2()}) {
    CAPTURE(model.name);
    for (const auto& s : kStrategies) {
      if (std::string(s.name) == "hsdp") continue;  // replicas need more than one GPU
      for (std::int64_t gas : {1, 2}) {
        CAPTURE(s.name);
        CAPTURE(documents::flavour_name(s.flavour));
        CAPTURE(gas);
        auto options = test_options(model, test_spec(s.name, s.flavour, 1), gas);
        options.adamw.lr = 1e-3;
        options.prefetch_as_planned = true;
        StandInCommunicator self(0, 1);
        const auto cpu = run_engine(options, {&self, &self, nullptr, true}, 3);
        const auto gpu = run_engine_on_gpu_nccl<float>(options, 3);
        REQUIRE(gpu.losses.size() == cpu.losses.size());
        CHECK(std::abs(gpu.losses[0] - cpu.losses[0]) <= kLoss * cpu.losses[0]);
        for (std::size_t k = 1; k < cpu.losses.size(); ++k)
          CHECK(std::abs(gpu.losses[k] - cpu.losses[k]) <= kLossAfterSteps * cpu.losses[k]);
      }
    }
  }
}
#endif

TEST_CASE("cuda::the model's loss and gradients are the CPU backend's (eager attention)") {
  const BatchShape shape{2, 7};
  for (const auto& spec : {tiny_llama(), tiny_gpt2(), tiny_neox()}) {
    CAPTURE(spec.name);
    for (auto checkpointing : {Checkpointing::none, Checkpointing::full}) {
      const Reference ref(spec, shape, checkpointing);
      check_close(run_on_gpu(ref, spec, shape, checkpointing, false), ref.result);
    }
  }
}

TEST_CASE("cuda::flash attention gives the eager CPU model's loss and gradients") {
  const BatchShape shape{2, 19};  // not a multiple of the kernels' tiles
  for (const auto& spec : {flash_llama(), flash_gpt2()}) {
    CAPTURE(spec.name);
    const Reference ref(spec, shape, Checkpointing::none);
    check_close(run_on_gpu(ref, spec, shape, Checkpointing::none, true), ref.result);
  }
}

TEST_CASE("cuda::the engine's steps are the CPU engine's under every strategy") {
  for (const auto& model : {tiny_llama(), tiny_gpt2()}) {
    CAPTURE(model.name);
    EngineRun gpu_ddp;
    for (const auto& s : kStrategies) {
      if (std::string(s.name) == "hsdp") continue;  // one GPU
      CAPTURE(s.name);
      CAPTURE(documents::flavour_name(s.flavour));
      auto options = test_options(model, test_spec(s.name, s.flavour, 1));
      options.adamw.lr = 1e-3;
      StandInCommunicator self(0, 1);
      const auto cpu = run_engine(options, {&self, &self, nullptr, true}, 3);
      const auto gpu = run_engine_on_gpu<float>(options, 3);
      REQUIRE(gpu.losses.size() == cpu.losses.size());
      CHECK(std::abs(gpu.losses[0] - cpu.losses[0]) <= kLoss * cpu.losses[0]);
      for (std::size_t k = 1; k < cpu.losses.size(); ++k)
        CHECK(std::abs(gpu.losses[k] - cpu.losses[k]) <= kLossAfterSteps * cpu.losses[k]);
      // The tracked bytes do not depend on where they live: the same buffers in the same order
      // (the eager backward's scratch aside, one [T, T] on the host, every head's on the GPU).
      CHECK(gpu.peak_bytes >= cpu.peak_bytes);
      // Sharded strategies against DDP on the same GPU: the same sums in another grouping.
      if (gpu_ddp.losses.empty()) {
        gpu_ddp = gpu;
        continue;
      }
      CHECK(std::abs(gpu.losses[0] - gpu_ddp.losses[0]) <= kLoss * gpu_ddp.losses[0]);
      for (std::size_t k = 1; k < gpu.losses.size(); ++k)
        CHECK(std::abs(gpu.losses[k] - gpu_ddp.losses[k]) <= kLossAfterSteps * gpu_ddp.losses[k]);
    }
  }
}

TEST_CASE("cuda::bf16-mixed trains as the CPU's bf16-mixed, and sharded as DDP, on the GPU") {
  // Both sides keep bf16 activations and accumulate in fp32 but round at different points (a
  // cuBLAS GEMM rounds its output once; the sums run in other orders), so values differ at bf16's
  // unit roundoff 2^-8 ≈ 3.9e-3: the losses within 1e-2 relative. AdamW moves each master weight
  // by about lr per step whatever its gradient's size: two runs that round differently must end
  // much closer (a quarter) than the steps moved the weights, as bf16 and fp32 do on the CPU
  // (test_engine_mixed.cpp: 0.008 against 0.16).
  for (const auto& model : {tiny_llama(), tiny_gpt2()}) {
    CAPTURE(model.name);
    StandInCommunicator self(0, 1);
    const EngineGroups one{&self, &self, nullptr, true};
    const auto initial = run_engine(test_options(model, test_spec("ddp", Flavour::ddp, 1)), one, 0);
    EngineRun gpu_ddp;
    for (const auto& s : kStrategies) {
      if (std::string(s.name) == "hsdp") continue;  // one GPU
      CAPTURE(std::string(s.name));
      CAPTURE(std::string(documents::flavour_name(s.flavour)));
      auto options = test_options(model, test_spec(s.name, s.flavour, 1));
      options.precision = documents::Precision::bf16_mixed;
      const auto cpu = run_engine(options, one, 3);
      const auto gpu = run_engine_on_gpu<bf16>(options, 3);
      REQUIRE(gpu.losses.size() == cpu.losses.size());
      for (std::size_t k = 0; k < cpu.losses.size(); ++k)
        CHECK(std::abs(gpu.losses[k] - cpu.losses[k]) <= 1e-2 * cpu.losses[k]);
      const double moved = relative_l2(cpu.params, initial.params);
      CHECK(relative_l2(gpu.params, cpu.params) < 0.25 * moved);
      if (gpu_ddp.losses.empty()) {
        gpu_ddp = gpu;
        continue;
      }
      for (std::size_t k = 0; k < gpu.losses.size(); ++k)
        CHECK(std::abs(gpu.losses[k] - gpu_ddp.losses[k]) <= 1e-2 * gpu_ddp.losses[k]);
      CHECK(relative_l2(gpu.params, gpu_ddp.params) < 0.25 * moved);
    }
  }
}
