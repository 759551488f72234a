#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <vector>

#include "executor/synthetic_data.hpp"
#include "kernels/adamw.hpp"
#include "model_fixture.hpp"

using namespace shardplan::executor;
using namespace shardplan::kernels;
using namespace shardplan::executor::testing;

TEST_CASE("executor::synthetic tokens are reproducible and shifted") {
  TrackedAllocator allocator;
  auto a = synthetic_batch(allocator, 17, {2, 8}, 50);
  auto b = synthetic_batch(allocator, 17, {2, 8}, 50);
  auto c = synthetic_batch(allocator, 18, {2, 8}, 50);
  CHECK(std::equal(a.inputs.data(), a.inputs.data() + 16, b.inputs.data()));
  CHECK(!std::equal(a.inputs.data(), a.inputs.data() + 16, c.inputs.data()));
  for (std::int64_t t = 0; t + 1 < 8; ++t) CHECK(a.targets[t] == a.inputs[t + 1]);
  for (std::int64_t i = 0; i < 16; ++i) CHECK((a.inputs[i] >= 0 && a.inputs[i] < 50));
  CHECK(allocator.in_use_bytes(MemoryCategory::activations) == 3 * 2 * 16 * 4);
}

TEST_CASE("executor::loss decreases over 20 AdamW steps on a fixed batch") {
  for (const auto& spec : {tiny_llama(), tiny_gpt2(), tiny_neox()}) {
    CAPTURE(spec.name);
    TrackedAllocator allocator;
    WholeModel<float> m(spec, allocator, 21);
    std::vector<Buffer> exp_avg, exp_avg_sq;
    for (const auto& p : m.params) {
      exp_avg.push_back(allocator.allocate<float>(MemoryCategory::optimizer_states, p.size()));
      exp_avg_sq.push_back(allocator.allocate<float>(MemoryCategory::optimizer_states, p.size()));
    }
    const BatchShape shape{2, 8};
    auto batch = synthetic_batch(allocator, 3, shape, spec.vocab);
    const AdamWOptions adamw{.lr = 1e-2, .weight_decay = 0.0};
    std::vector<double> losses;
    for (std::int64_t step = 1; step <= 20; ++step) {
      m.zero_grads();
      losses.push_back(
          m.run(batch.inputs.span(), batch.targets.span(), shape, Checkpointing::none, true));
      for (std::size_t u = 0; u < m.params.size(); ++u)
        adamw_step<float>(m.params[u].span(), m.grads[u].span(), exp_avg[u].span(),
                          exp_avg_sq[u].span(), step, adamw);
    }
    MESSAGE(spec.name << ": loss " << losses.front() << " -> " << losses.back());
    CHECK(losses.front() == doctest::Approx(std::log(50.0)).epsilon(0.05));  // uniform start
    CHECK(losses.back() < 0.5 * losses.front());

    // Model states at the peak: exactly 4 + 4 + 8 bytes per parameter.
    const auto at_peak = allocator.breakdown_at_peak();
    const std::int64_t params = spec.total_params();
    CHECK(at_peak[MemoryCategory::parameters] == 4 * params);
    CHECK(at_peak[MemoryCategory::gradients] == 4 * params);
    CHECK(at_peak[MemoryCategory::optimizer_states] == 8 * params);
    CHECK(at_peak[MemoryCategory::activations] > 0);
    CHECK(allocator.in_use_bytes(MemoryCategory::activations) == 2 * shape.tokens() * 4);
  }
}
