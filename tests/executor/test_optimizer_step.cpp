// The optimizer step (executor/optimizer_step.hpp) and its loss scaler (loss_scaler.hpp).
#include <doctest/doctest.h>

#include <limits>
#include <vector>

#include "engine_state_fixture.hpp"
#include "executor/optimizer_step.hpp"
#include "kernels/adamw.hpp"

using namespace shardplan;
using namespace shardplan::executor;
using namespace shardplan::kernels;
using namespace shardplan::executor::testing;
using documents::Flavour;

TEST_CASE("loss scaler::a disabled scaler keeps 1 and never skips") {
  LossScaler scaler;
  CHECK_FALSE(scaler.enabled());
  CHECK(scaler.scale() == 1.0);
}

TEST_CASE("loss scaler::an overflow halves the scale and skips the step") {
  LossScaler scaler(65536.0);
  CHECK(scaler.enabled());
  CHECK(scaler.update(true));
  CHECK(scaler.good_steps() == 1);
  CHECK_FALSE(scaler.update(false));
  CHECK(scaler.scale() == 32768.0);
  CHECK(scaler.good_steps() == 0);
}

TEST_CASE("loss scaler::the scale doubles after the growth interval of good steps") {
  LossScaler scaler(8.0);
  for (std::int64_t k = 1; k < LossScaler::kGrowthInterval; ++k) REQUIRE(scaler.update(true));
  CHECK(scaler.scale() == 8.0);
  CHECK(scaler.update(true));
  CHECK(scaler.scale() == 16.0);
  CHECK(scaler.good_steps() == 0);
}

namespace {

// Every unit's whole gradient set to `value` (a plain fp32 DDP state without bucket copies).
template <class S> void set_whole_grads(StateFixture<S>& f, float value) {
  for (auto& buffers : f.state.units) {
    const std::int64_t n = buffers.exp_avg.size();
    buffers.whole_grads = f.allocator.template allocate<float>(MemoryCategory::gradients, n);
    std::fill(buffers.whole_grads.data(), buffers.whole_grads.data() + n, value);
  }
}

std::vector<float> copy_of(const TrackedBuffer<float>& b) {
  return {b.data(), b.data() + b.size()};
}

}  // namespace

TEST_CASE("optimizer step::AdamW updates every unit as adamw_step does") {
  auto spec = test_spec("ddp", Flavour::ddp, 1);
  spec.grad_bucket_copy = false;
  StateFixture<> f(test_options(tiny_llama(), spec));
  OptimizerStep<float> optimizer(f.state);
  set_whole_grads(f, 0.25f);
  f.state.step_count = 1;
  std::vector<std::vector<float>> params, m, v;
  for (auto& buffers : f.state.units) {
    params.push_back(copy_of(buffers.params));
    m.push_back(copy_of(buffers.exp_avg));
    v.push_back(copy_of(buffers.exp_avg_sq));
    const std::vector<float> g(params.back().size(), 0.25f);
    adamw_step<float>(params.back(), g, m.back(), v.back(), 1, f.state.options.adamw);
  }
  CHECK(optimizer.run());
  for (std::size_t u = 0; u < params.size(); ++u) {
    CHECK(copy_of(f.state.units[u].params) == params[u]);
    CHECK(copy_of(f.state.units[u].exp_avg) == m[u]);
  }
}

TEST_CASE("optimizer step::fp16 skips a step whose gradients overflow and unscales the others") {
  auto spec = test_spec("ddp", Flavour::ddp, 1);
  spec.grad_bucket_copy = false;
  spec.reduce_dtype = documents::DType::fp32;
  auto options = test_options(tiny_llama(), spec);
  options.precision = documents::Precision::fp16_mixed;
  options.initial_loss_scale = 1024.0;
  StateFixture<f16> f(options);
  OptimizerStep<f16> optimizer(f.state);
  f.state.step_count = 1;
  set_whole_grads(f, 1.0f);
  f.state.units[1].whole_grads.data()[3] = std::numeric_limits<float>::infinity();
  const auto before = copy_of(f.state.units[0].params);
  CHECK_FALSE(optimizer.run());
  CHECK(optimizer.loss_scaler().scale() == 512.0);
  CHECK(copy_of(f.state.units[0].params) == before);
  set_whole_grads(f, 512.0f);
  CHECK(optimizer.run());
  CHECK(optimizer.loss_scaler().scale() == 512.0);
  CHECK(f.state.units[0].whole_grads.data()[0] == 1.0f);  // unscaled in place
  CHECK(copy_of(f.state.units[0].params) != before);
}
