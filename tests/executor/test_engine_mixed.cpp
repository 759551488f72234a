// The sharding engine under mixed precision (bf16-mixed, fp16-mixed) in one process: its
// training against fp32's, fp16's loss scaling, and what it refuses. (Its memory against the cost
// model's: test_engine.cpp, under every precision.)
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "engine_fixture.hpp"

using namespace shardplan;
using namespace shardplan::executor;
using namespace shardplan::kernels;
using namespace shardplan::executor::testing;
using documents::Flavour;
using documents::Precision;

namespace {

EngineOptions mixed_options(const documents::ModelSpec& model, const documents::ShardingSpec& spec,
                            Precision precision, std::int64_t grad_accumulation = 2,
                            Checkpointing ckpt = Checkpointing::none) {
  auto o = test_options(model, spec, grad_accumulation, ckpt);
  o.precision = precision;
  return o;
}

}  // namespace

TEST_CASE("engine_mixed::bf16-mixed trains as fp32 within bf16's rounding") {
  // One rank, so nothing but the precision differs. bf16 keeps 8 significant bits (unit roundoff
  // 2^-8 ≈ 3.9e-3): the logits and so the loss (computed in fp32 from them) agree to about 1e-2
  // relative. The master weights: AdamW moves each by about lr per step whatever its gradient's
  // size, so rounding the gradient changes an update only where its sign flips. The bf16 run's
  // weights must differ from fp32's by much less than training moved them (under a quarter;
  // measured on the tiny Llama: 0.008 against 0.16), and by something (it really rounds).
  for (const auto& s : kStrategies) {
    if (std::string(s.name) == "hsdp") continue;
    CAPTURE(std::string(s.name));
    CAPTURE(std::string(documents::flavour_name(s.flavour)));
    const auto spec = test_spec(s.name, s.flavour, 1);
    StandInCommunicator self(0, 1);
    const EngineGroups one{&self, &self, nullptr, false};
    const auto initial = run_engine(mixed_options(tiny_llama(), spec, Precision::fp32), one, 0);
    const auto fp32 = run_engine(mixed_options(tiny_llama(), spec, Precision::fp32), one, 3);
    const auto bf16 = run_engine(mixed_options(tiny_llama(), spec, Precision::bf16_mixed), one, 3);
    for (std::size_t k = 0; k < fp32.losses.size(); ++k)
      CHECK(bf16.losses[k] == doctest::Approx(fp32.losses[k]).epsilon(1e-2));
    const double moved = relative_l2(fp32.params, initial.params);
    const double rel = relative_l2(bf16.params, fp32.params);
    MESSAGE(std::string(s.name) << ": bf16 vs fp32 master weights, relative L2 " << rel
                                << "; training moved them by " << moved);
    CHECK(rel < 0.25 * moved);
    CHECK(rel > 0);
  }
}

TEST_CASE(
    "engine_mixed::fp16-mixed skips the steps whose gradients overflow and halves the scale") {
  // GradScaler's policy: a step whose scaled gradients are not finite changes nothing and halves
  // the scale; a step that is taken keeps it (growth only after 2000). From 2^24 the first steps
  // overflow: the head's logit gradient is scale/N·(p − 1) per token, N = 16 tokens, about 2^20,
  // beyond fp16's largest finite 65504; from 2^11 on it is finite.
  const auto spec = test_spec("fsdp-full", Flavour::fsdp2, 1);
  StandInCommunicator self(0, 1);
  auto options = mixed_options(tiny_llama(), spec, Precision::fp16_mixed, 1);
  options.initial_loss_scale = 1 << 24;
  TrackedAllocator allocator;
  ShardingEngine engine(options, allocator, {&self, &self, nullptr, false});
  double scale = 1 << 24;
  int taken = 0, skipped = 0;
  for (int k = 0; k < 24 && taken < 3; ++k) {
    std::vector<std::vector<float>> before;
    for (std::int64_t u = 0; u < engine.layout().unit_count(); ++u)
      before.push_back(engine.full_parameters(u));
    const auto r = engine.step();
    CHECK(r.loss_scale == scale);
    bool changed = false;
    for (std::int64_t u = 0; u < engine.layout().unit_count(); ++u)
      changed = changed || engine.full_parameters(u) != before[static_cast<std::size_t>(u)];
    CHECK(changed == !r.skipped);
    if (r.skipped) {
      scale /= 2;
      ++skipped;
    } else {
      ++taken;
    }
  }
  CHECK(taken == 3);
  CHECK(skipped >= 1);
  MESSAGE("fp16-mixed from 2^24: " << skipped << " steps skipped, scale now " << scale);
  // The same model's fp32 loss is within fp16's rounding of the first step's.
  auto fp32 = options;
  fp32.precision = Precision::fp32;
  TrackedAllocator a32;
  ShardingEngine reference(fp32, a32, {&self, &self, nullptr, false});
  options.initial_loss_scale = 65536;
  TrackedAllocator a16;
  ShardingEngine again(options, a16, {&self, &self, nullptr, false});
  CHECK(again.step().loss == doctest::Approx(reference.step().loss).epsilon(2e-3));
}

TEST_CASE("engine_mixed::what the engine does not run is refused") {
  StandInCommunicator self(0, 1);
  TrackedAllocator allocator;
  auto o = mixed_options(tiny_llama(), test_spec("fsdp-full", Flavour::fsdp2, 1), Precision::bf16);
  CHECK_THROWS_AS(ShardingEngine(o, allocator, {&self, &self, nullptr, false}),
                  std::invalid_argument);
  // FSDP reducing in fp32 gradients computed in bf16: the engine reduces in the compute type.
  o.precision = Precision::bf16_mixed;
  o.spec.reduce_dtype = documents::DType::fp32;
  try {
    ShardingEngine engine(o, allocator, {&self, &self, nullptr, false});
    FAIL("accepted an fp32 reduction of bf16 gradients");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("reduce_dtype fp32 with bf16-mixed") != std::string::npos);
  }
}
