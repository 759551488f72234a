#include "calibrate/elementwise_bench.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "kernels/kernels.hpp"

namespace shardplan::calibrate {

using documents::ElementwiseKind;
using documents::ElementwiseOp;

std::vector<ElementwiseOp> model_elementwise_ops(const documents::ModelSpec& m) {
  std::vector<ElementwiseOp> ops;
  for (auto op : documents::block_elementwise_ops(m)) {
    op.count *= static_cast<double>(m.layers);
    ops.push_back(op);
  }
  for (const auto& op : documents::head_elementwise_ops(m)) ops.push_back(op);
  for (const auto& op : documents::embedding_elementwise_ops(m)) ops.push_back(op);
  return ops;
}

namespace {

constexpr std::int64_t kMaxElements = 16 << 20;

std::vector<float> filled(std::int64_t n, std::uint32_t seed) {
  std::vector<float> v(static_cast<std::size_t>(n));
  std::uint32_t x = seed;
  for (auto& e : v) {  // values in [-1, 1): a norm's or an activation's typical range
    x = x * 1664525u + 1013904223u;
    e = static_cast<float>(x >> 8) / static_cast<float>(1 << 23) - 1.0f;
  }
  return v;
}

// One forward and one backward of `kind` over rows × width elements.
class Layer {
public:
  Layer(ElementwiseKind kind, std::int64_t rows, std::int64_t width, std::int64_t head_dim)
      : kind_(kind), rows_(rows), width_(width), head_dim_(head_dim), n_(rows * width),
        x_(filled(n_, 1)), y_(filled(n_, 2)), dy_(filled(n_, 3)), dx_(filled(n_, 4)),
        z_(filled(n_, 5)), w_(filled(width, 6)), b_(filled(width, 7)),
        dw_(static_cast<std::size_t>(width)), db_(static_cast<std::size_t>(width)),
        mean_(static_cast<std::size_t>(rows)), rstd_(static_cast<std::size_t>(rows)),
        tokens_(static_cast<std::size_t>(rows)) {
    for (std::size_t i = 0; i < tokens_.size(); ++i)  // scattered rows of the [rows, width] table
      tokens_[i] = static_cast<std::int32_t>((i * 2654435761u) % tokens_.size());
  }

  void run() {
    const std::int64_t n = n_, r = rows_, c = width_;
    switch (kind_) {
    case ElementwiseKind::layernorm:
      kernels::layernorm_forward(y_.data(), mean_.data(), rstd_.data(), x_.data(), w_.data(),
                                 b_.data(), r, c, 1e-5f);
      kernels::layernorm_backward(dx_.data(), dw_.data(), db_.data(), dy_.data(), x_.data(),
                                  w_.data(), mean_.data(), rstd_.data(), r, c);
      break;
    case ElementwiseKind::rmsnorm:
      kernels::rmsnorm_forward(y_.data(), rstd_.data(), x_.data(), w_.data(), r, c, 1e-5f);
      kernels::rmsnorm_backward(dx_.data(), dw_.data(), dy_.data(), x_.data(), w_.data(),
                                rstd_.data(), r, c);
      break;
    case ElementwiseKind::residual:  // the stream copied forward, its gradient added backward
      std::copy(x_.begin(), x_.end(), y_.begin());
      for (std::int64_t i = 0; i < n; ++i)
        dx_[static_cast<std::size_t>(i)] += dy_[static_cast<std::size_t>(i)];
      break;
    case ElementwiseKind::rotary:
      kernels::rope_forward(y_.data(), 1, r, c / head_dim_, head_dim_, 10000.0);
      kernels::rope_backward(dy_.data(), 1, r, c / head_dim_, head_dim_, 10000.0);
      break;
    case ElementwiseKind::gelu:
      kernels::gelu_forward(y_.data(), x_.data(), n);
      kernels::gelu_backward(dx_.data(), x_.data(), dy_.data(), n);
      break;
    case ElementwiseKind::swiglu:
      kernels::swiglu_forward(y_.data(), x_.data(), z_.data(), n);
      kernels::swiglu_backward(dx_.data(), dy_.data(), y_.data(), x_.data(), z_.data(), n);
      break;
    case ElementwiseKind::embedding:  // x_ as the table: rows looked up, their gradient added
      kernels::embedding_forward(y_.data(), tokens_.data(), x_.data(), static_cast<float*>(nullptr),
                                 1, r, c);
      kernels::embedding_backward(dx_.data(), static_cast<float*>(nullptr), dy_.data(),
                                  tokens_.data(), 1, r, c);
      break;
    case ElementwiseKind::log_softmax:
      kernels::log_softmax_forward(y_.data(), x_.data(), r, c);
      kernels::log_softmax_backward(dx_.data(), dy_.data(), y_.data(), r, c);
      break;
    }
  }

private:
  ElementwiseKind kind_;
  std::int64_t rows_, width_, head_dim_, n_;
  std::vector<float> x_, y_, dy_, dx_, z_, w_, b_, dw_, db_, mean_, rstd_;
  std::vector<std::int32_t> tokens_;
};

double seconds_of(Layer& layer, double min_seconds) {
  using clock = std::chrono::steady_clock;
  auto begin = clock::now();
  layer.run();  // untimed: first touch
  const double first = std::max(std::chrono::duration<double>(clock::now() - begin).count(), 1e-9);
  const int runs = std::clamp(static_cast<int>(std::ceil(min_seconds / first)), 3, 50);
  std::vector<double> times;
  for (int i = 0; i < runs; ++i) {
    begin = clock::now();
    layer.run();
    times.push_back(std::chrono::duration<double>(clock::now() - begin).count());
  }
  std::nth_element(times.begin(), times.begin() + runs / 2, times.end());
  return times[static_cast<std::size_t>(runs / 2)];
}

}  // namespace

double time_cpu_elementwise_rate(const std::vector<ElementwiseOp>& ops, std::int64_t tokens,
                                 std::int64_t head_dim, double min_seconds) {
  double passes = 0, seconds = 0;
  for (const auto& op : ops) {
    const auto width = static_cast<std::int64_t>(op.width);
    if (width <= 0 || op.count <= 0) continue;
    // Rotary pairs channels within a head: a width that is not whole heads is run as one head.
    const std::int64_t hd =
        op.kind == ElementwiseKind::rotary && width % head_dim == 0 ? head_dim : width;
    const std::int64_t rows = std::clamp<std::int64_t>(kMaxElements / width, 1, tokens);
    Layer layer(op.kind, rows, width, hd);
    const double t = seconds_of(layer, min_seconds);
    const auto p = documents::passes_of(op.kind);
    passes += op.count * static_cast<double>(rows * width) * (p.forward + p.backward);
    seconds += op.count * t;
  }
  return seconds > 0 ? passes / seconds : 0.0;
}

}  // namespace shardplan::calibrate
