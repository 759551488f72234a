#include "kernels/adamw.hpp"

#include <cmath>
#include <stdexcept>

#include <Eigen/Core>
#include <fmt/format.h>

namespace shardplan::kernels {

template <class S>
void adamw_step(std::span<S> params, std::span<const S> grads, std::span<S> exp_avg,
                std::span<S> exp_avg_sq, std::int64_t step, const AdamWOptions& o) {
  const std::size_t n = params.size();
  if (grads.size() != n || exp_avg.size() != n || exp_avg_sq.size() != n)
    throw std::invalid_argument(
        fmt::format("adamw_step: params {}, grads {}, exp_avg {}, exp_avg_sq {} elements differ", n,
                    grads.size(), exp_avg.size(), exp_avg_sq.size()));
  if (step < 1) throw std::invalid_argument(fmt::format("adamw_step: step {} < 1", step));
  const double t = static_cast<double>(step);
  const S decay = static_cast<S>(1.0 - o.lr * o.weight_decay);
  const S one_minus_beta1 = static_cast<S>(1.0 - o.beta1);
  const S beta2 = static_cast<S>(o.beta2);
  const S one_minus_beta2 = static_cast<S>(1.0 - o.beta2);
  const S step_size = static_cast<S>(o.lr / (1.0 - std::pow(o.beta1, t)));
  const S bias_correction2_sqrt = static_cast<S>(std::sqrt(1.0 - std::pow(o.beta2, t)));
  const S eps = static_cast<S>(o.eps);
  // The same element-wise arithmetic as a loop, on Eigen arrays so it is vectorised (a loop with
  // std::sqrt is not, since sqrt may set errno).
  using Array = Eigen::Array<S, Eigen::Dynamic, 1>;
  const auto count = static_cast<Eigen::Index>(n);
  Eigen::Map<Array> p(params.data(), count), m(exp_avg.data(), count), v(exp_avg_sq.data(), count);
  Eigen::Map<const Array> g(grads.data(), count);
  p *= decay;
  m += one_minus_beta1 * (g - m);
  v = beta2 * v + one_minus_beta2 * g * g;
  p -= step_size * m / (v.sqrt() / bias_correction2_sqrt + eps);
}

template void adamw_step<float>(std::span<float>, std::span<const float>, std::span<float>,
                                std::span<float>, std::int64_t, const AdamWOptions&);
template void adamw_step<double>(std::span<double>, std::span<const double>, std::span<double>,
                                 std::span<double>, std::int64_t, const AdamWOptions&);

}  // namespace shardplan::kernels
