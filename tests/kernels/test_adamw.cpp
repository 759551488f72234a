#include <doctest/doctest.h>

#include <stdexcept>
#include <vector>

#include "kernels/adamw.hpp"

using namespace shardplan::kernels;

// Two elements, two steps, lr 0.1, β 0.9/0.999, ε 1e-8, weight decay 0.1, by hand:
// step 1, θ = 1, g = 0.5:   θ·(1 − 0.01) = 0.99; m = 0.05; v = 0.001·0.25 = 2.5e-4;
//   step size 0.1 / (1 − 0.9) = 1; denominator √2.5e-4 / √0.001 + ε = 0.5 + 1e-8;
//   θ = 0.99 − 0.05 / 0.50000001 = 0.890000002
// step 2, g = −0.25:        θ = 0.890000002·0.99 = 0.88110000198; m = 0.05 + 0.1·(−0.3) = 0.02;
//   v = 0.999·2.5e-4 + 0.001·0.0625 = 3.1225e-4; step size 0.1 / 0.19;
//   denominator √3.1225e-4 / √0.001999 + ε = 0.395225…;
//   θ = 0.88110000198 − 0.0266337… = 0.8544662987
// step 1, θ = −2, g = −3:   θ = −1.98; m = −0.3; v = 0.009; denominator 3 + 1e-8;
//   θ = −1.98 + 0.3 / 3.00000001 = −1.8800000003
// step 2, g = 0:            θ = −1.861200000297; m = −0.27; v = 0.008991;
//   denominator √0.008991 / √0.001999 + ε = 2.120787…;
//   θ = −1.8612000003 + 0.0670058… = −1.7941941752
TEST_CASE("kernels::adamw two steps against a hand computation") {
  const AdamWOptions o{.lr = 0.1, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1};
  std::vector<double> p = {1.0, -2.0}, m(2, 0.0), v(2, 0.0);
  adamw_step<double>(p, std::vector<double>{0.5, -3.0}, m, v, 1, o);
  CHECK(p[0] == doctest::Approx(0.890000002).epsilon(1e-12));
  CHECK(p[1] == doctest::Approx(-1.8800000003333333).epsilon(1e-12));
  CHECK(m[0] == doctest::Approx(0.05).epsilon(1e-12));
  CHECK(v[1] == doctest::Approx(0.009).epsilon(1e-12));
  adamw_step<double>(p, std::vector<double>{-0.25, 0.0}, m, v, 2, o);
  CHECK(p[0] == doctest::Approx(0.8544662986878463).epsilon(1e-12));
  CHECK(p[1] == doctest::Approx(-1.7941941752322936).epsilon(1e-12));

  // The fp32 executor takes the same steps to fp32 precision.
  std::vector<float> pf = {1.0f, -2.0f}, mf(2, 0.0f), vf(2, 0.0f);
  adamw_step<float>(pf, std::vector<float>{0.5f, -3.0f}, mf, vf, 1, o);
  adamw_step<float>(pf, std::vector<float>{-0.25f, 0.0f}, mf, vf, 2, o);
  CHECK(static_cast<double>(pf[0]) == doctest::Approx(0.8544662986878463).epsilon(1e-6));
  CHECK(static_cast<double>(pf[1]) == doctest::Approx(-1.7941941752322936).epsilon(1e-6));
}

TEST_CASE("kernels::adamw on a shard equals adamw on the whole") {
  const AdamWOptions o{};
  std::vector<float> whole = {0.1f, -0.2f, 0.3f, 0.4f, -0.5f}, m(5, 0.0f), v(5, 0.0f);
  std::vector<float> grads = {0.01f, 0.02f, -0.03f, 0.5f, 0.0f};
  std::vector<float> shard = whole, ms = m, vs = v;
  adamw_step<float>(whole, grads, m, v, 1, o);
  // Two ranks' shards [0, 3) and [3, 5) updated separately.
  adamw_step<float>(std::span(shard).first(3), std::span<const float>(grads).first(3),
                    std::span(ms).first(3), std::span(vs).first(3), 1, o);
  adamw_step<float>(std::span(shard).subspan(3), std::span<const float>(grads).subspan(3),
                    std::span(ms).subspan(3), std::span(vs).subspan(3), 1, o);
  CHECK(shard == whole);
}

TEST_CASE("kernels::adamw refuses mismatched spans and step 0") {
  std::vector<float> a(3), b(2);
  CHECK_THROWS_AS(adamw_step<float>(a, b, a, a, 1, {}), std::invalid_argument);
  CHECK_THROWS_WITH_AS(adamw_step<float>(a, a, a, a, 0, {}), "adamw_step: step 0 < 1",
                       std::invalid_argument);
}
