#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "executor/gpt_model.hpp"
#include "executor/synthetic_data.hpp"
#include "model_fixture.hpp"

using namespace shardplan::executor;
using namespace shardplan::kernels;
using namespace shardplan::executor::testing;
using shardplan::documents::ModelSpec;

namespace {

constexpr BatchShape kShape{2, 8};

struct GradCheckResult {
  double max_rel_error = 0;
  double max_abs_error = 0;
  std::int64_t checked = 0;
};

// Double-sided finite differences in double precision, ε = 1e-5: (L(θ + ε) − L(θ − ε)) / 2ε,
// truncation error O(ε²), roundoff one ulp of L (≈ 4.4e-16 for L ≈ 4) / 2ε ≈ 4.4e-11. Relative
// error |analytic − numeric| / max(|analytic|, |numeric|, 1e-4): the floor judges the entries
// whose gradient is about zero (a key bias without rotary has exactly zero gradient: softmax
// ignores a constant added to a row of scores; position rows past T) by their absolute error
// instead of dividing the roundoff by zero. Every tensor of every unit is checked, at up to 64
// elements spread over it, at a point moved away from the initial values so that norm weights
// and biases are generic.
GradCheckResult gradient_check(const ModelSpec& spec) {
  TrackedAllocator allocator;
  WholeModel<double> m(spec, allocator, 1234);
  m.perturb(99, 0.3);
  auto batch = synthetic_batch(allocator, 7, kShape, spec.vocab);
  const auto tokens = batch.inputs.span();
  const auto targets = batch.targets.span();
  m.zero_grads();
  m.run(tokens, targets, kShape, Checkpointing::none, true);

  const double eps = 1e-5;
  GradCheckResult r;
  for (std::int64_t u = 0; u < m.units(); ++u) {
    const auto& slots = m.model.layout().slots(m.model.layout().unit_kind(u));
    auto& params = m.params[static_cast<std::size_t>(u)];
    const auto& grads = m.grads[static_cast<std::size_t>(u)];
    for (const auto& slot : slots) {
      const std::int64_t n = slot.tensor.elements();
      const std::int64_t samples = std::min<std::int64_t>(n, 64);
      for (std::int64_t s = 0; s < samples; ++s) {
        const std::int64_t stride = std::max<std::int64_t>(1, n / samples);
        const std::int64_t e = slot.offset + (s * n) / samples + (s * 7) % stride;
        const double saved = params[e];
        params[e] = saved + eps;
        const double plus = m.run(tokens, targets, kShape, Checkpointing::none, false);
        params[e] = saved - eps;
        const double minus = m.run(tokens, targets, kShape, Checkpointing::none, false);
        params[e] = saved;
        const double numeric = (plus - minus) / (2 * eps);
        const double analytic = grads[e];
        const double rel =
            std::abs(analytic - numeric) / std::max({std::abs(analytic), std::abs(numeric), 1e-4});
        r.max_rel_error = std::max(r.max_rel_error, rel);
        r.max_abs_error = std::max(r.max_abs_error, std::abs(analytic - numeric));
        ++r.checked;
      }
    }
  }
  return r;
}

// Tolerance of the double-precision check (relative, as above). Measured worst errors are
// printed by each case; a wrong formula gives errors of order one.
constexpr double kGradTolerance = 1e-5;

}  // namespace

// GQA, explicit head_dim, SwiGLU, RMSNorm, rotary, untied head.
TEST_CASE("executor::gradient check llama-like") {
  const auto spec = tiny_llama();
  REQUIRE(spec.kv_heads == 2);
  REQUIRE(spec.head_dim * spec.heads != spec.hidden);
  const auto r = gradient_check(spec);
  MESSAGE("llama-like: max relative error " << r.max_rel_error << ", max absolute error "
                                            << r.max_abs_error << ", over " << r.checked
                                            << " parameters");
  CHECK(r.checked > 300);
  CHECK(r.max_rel_error < kGradTolerance);
}

// LayerNorm with biases, linear biases, learned positions, GELU, tied head.
TEST_CASE("executor::gradient check gpt2-like") {
  const auto spec = tiny_gpt2();
  REQUIRE(spec.tied_embeddings);
  const auto r = gradient_check(spec);
  MESSAGE("gpt2-like: max relative error " << r.max_rel_error << ", max absolute error "
                                           << r.max_abs_error << ", over " << r.checked
                                           << " parameters");
  CHECK(r.checked > 300);
  CHECK(r.max_rel_error < kGradTolerance);
}

// Parallel residual, fused query_key_value, rotary, LayerNorm, GELU, untied head.
TEST_CASE("executor::gradient check gpt-neox-like") {
  const auto spec = tiny_neox();
  REQUIRE(spec.parallel_residual);
  const auto r = gradient_check(spec);
  MESSAGE("gpt-neox-like: max relative error " << r.max_rel_error << ", max absolute error "
                                               << r.max_abs_error << ", over " << r.checked
                                               << " parameters");
  CHECK(r.checked > 300);
  CHECK(r.max_rel_error < kGradTolerance);
}

TEST_CASE("executor::recompute gives bitwise the stored path's gradients") {
  for (const auto& spec : {tiny_llama(), tiny_gpt2(), tiny_neox()}) {
    CAPTURE(spec.name);
    TrackedAllocator allocator;
    WholeModel<float> m(spec, allocator, 5);
    m.perturb(6, 0.1);
    auto batch = synthetic_batch(allocator, 8, kShape, spec.vocab);
    const double stored =
        m.run(batch.inputs.span(), batch.targets.span(), kShape, Checkpointing::none, true);
    std::vector<std::vector<float>> stored_grads;
    for (auto& g : m.grads) stored_grads.emplace_back(g.data(), g.data() + g.size());
    m.zero_grads();
    const double recomputed =
        m.run(batch.inputs.span(), batch.targets.span(), kShape, Checkpointing::full, true);
    CHECK(stored == recomputed);
    for (std::size_t u = 0; u < m.grads.size(); ++u) {
      CAPTURE(u);
      REQUIRE(m.grads[u].size() == static_cast<std::int64_t>(stored_grads[u].size()));
      CHECK(std::memcmp(m.grads[u].data(), stored_grads[u].data(),
                        stored_grads[u].size() * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("executor::gradients accumulate over micro-batches") {
  const auto spec = tiny_gpt2();  // tied: the head also adds into the embedding unit
  TrackedAllocator allocator;
  WholeModel<double> m(spec, allocator, 11);
  auto batch = synthetic_batch(allocator, 12, kShape, spec.vocab);
  m.run(batch.inputs.span(), batch.targets.span(), kShape, Checkpointing::none, true);
  std::vector<std::vector<double>> once;
  for (auto& g : m.grads) once.emplace_back(g.data(), g.data() + g.size());
  m.run(batch.inputs.span(), batch.targets.span(), kShape, Checkpointing::full, true);
  double worst = 0;
  for (std::size_t u = 0; u < m.grads.size(); ++u)
    for (std::size_t i = 0; i < once[u].size(); ++i)
      worst = std::max(worst, std::abs(m.grads[u][static_cast<std::int64_t>(i)] - 2 * once[u][i]));
  CHECK(worst < 1e-14);
}

namespace {

// forward_block and forward_head grow the tracked activations by what block_saved_bytes and
// head_saved_bytes say, for elements of type S.
template <class S> void check_saved_bytes(const ModelSpec& spec, const char* type) {
  CAPTURE(type);
  TrackedAllocator allocator;
  GptModel<S> model(spec, allocator);
  const auto& layout = model.layout();
  const auto unit_params = [&](std::int64_t unit) {
    std::vector<float> values(static_cast<std::size_t>(layout.unit_size_of(unit)));
    init_unit_params<float>(layout, unit, 3, 0, values);
    return narrowed<S>(allocator, MemoryCategory::parameters, values);
  };
  auto params = unit_params(1);
  auto head_params = unit_params(layout.unit_count() - 1);
  auto emb_params = unit_params(0);
  auto batch = synthetic_batch(allocator, 1, kShape, spec.vocab);
  const std::int64_t nh = kShape.tokens() * spec.hidden;
  const auto bytes = static_cast<std::int64_t>(sizeof(S));

  for (auto mode : {Checkpointing::none, Checkpointing::full}) {
    auto x = allocator.allocate<S>(MemoryCategory::activations, nh);
    const auto before = allocator.in_use_bytes(MemoryCategory::activations);
    auto f = model.forward_block(params.span(), std::move(x), kShape, mode);
    // The block adds what it saves beyond its (already counted) input, and its output [N, h]:
    // together exactly block_saved_bytes.
    CHECK(allocator.in_use_bytes(MemoryCategory::activations) - before ==
          block_saved_bytes(layout, kShape, mode, false, bytes));
  }
  auto x = allocator.allocate<S>(MemoryCategory::activations, nh);
  const auto before = allocator.in_use_bytes(MemoryCategory::activations);
  auto h = model.forward_head(head_params.span(), emb_params.span(), std::move(x),
                              batch.targets.span(), kShape);
  CHECK(allocator.in_use_bytes(MemoryCategory::activations) - before ==
        head_saved_bytes(layout, kShape, bytes) - nh * bytes);
}

}  // namespace

TEST_CASE("executor::saved activations are what block_saved_bytes says") {
  for (const auto& spec : {tiny_llama(), tiny_gpt2(), tiny_neox()}) {
    CAPTURE(spec.name);
    check_saved_bytes<float>(spec, "float");
    check_saved_bytes<bf16>(spec, "bf16");
  }
}

TEST_CASE("executor::backward frees what the forward saved") {
  const auto spec = tiny_llama();
  TrackedAllocator allocator;
  WholeModel<float> m(spec, allocator, 2);
  auto batch = synthetic_batch(allocator, 3, kShape, spec.vocab);
  const auto before = allocator.in_use();
  m.run(batch.inputs.span(), batch.targets.span(), kShape, Checkpointing::none, true);
  CHECK(allocator.in_use().bytes == before.bytes);
  // Full checkpointing keeps less at the peak than storing everything.
  allocator.reset_peaks();
  m.run(batch.inputs.span(), batch.targets.span(), kShape, Checkpointing::full, true);
  const auto full_peak = allocator.peak_bytes(MemoryCategory::activations);
  allocator.reset_peaks();
  m.run(batch.inputs.span(), batch.targets.span(), kShape, Checkpointing::none, true);
  CHECK(full_peak < allocator.peak_bytes(MemoryCategory::activations));
}

TEST_CASE("executor::bad inputs are refused with a message") {
  const auto spec = tiny_gpt2();
  TrackedAllocator allocator;
  GptModel<float> model(spec, allocator);
  auto params =
      allocator.allocate<float>(MemoryCategory::parameters, model.layout().embedding().size);
  std::vector<std::int32_t> tokens(16, 3);
  tokens[5] = 50;
  CHECK_THROWS_WITH_AS(model.forward_embedding(params.span(), tokens, kShape),
                       "forward_embedding tokens: token 50 outside the vocabulary of 50",
                       std::invalid_argument);
  std::vector<std::int32_t> long_tokens(std::size_t{2} * 13, 1);
  CHECK_THROWS_WITH_AS(model.forward_embedding(params.span(), long_tokens, BatchShape{2, 13}),
                       "sequence of 13 tokens is longer than the 12 learned positions",
                       std::invalid_argument);
  CHECK_THROWS_AS(
      model.forward_embedding(params.span().first(10), std::vector<std::int32_t>(16, 1), kShape),
      std::invalid_argument);
}
