#include "calibrate/cpu_bench.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

#include <Eigen/Dense>

namespace shardplan::calibrate {
namespace {

double seconds_since(std::chrono::steady_clock::time_point begin) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
}

}  // namespace

double time_cpu_gemm(const GemmShape& shape, double min_seconds) {
  const Eigen::MatrixXf a = Eigen::MatrixXf::Random(shape.m, shape.k);
  const Eigen::MatrixXf b = Eigen::MatrixXf::Random(shape.k, shape.n);
  Eigen::MatrixXf c(shape.m, shape.n);
  auto begin = std::chrono::steady_clock::now();
  c.noalias() = a * b;  // untimed: first touch of c, caches
  const double first = std::max(seconds_since(begin), 1e-9);
  // At least three timed runs, each timed alone; the median resists a preempted run.
  const int runs = std::clamp(static_cast<int>(std::ceil(min_seconds / first)), 3, 50);
  std::vector<double> times;
  for (int i = 0; i < runs; ++i) {
    begin = std::chrono::steady_clock::now();
    c.noalias() = a * b;
    times.push_back(seconds_since(begin));
  }
  std::nth_element(times.begin(), times.begin() + runs / 2, times.end());
  const double per_gemm = times[static_cast<std::size_t>(runs / 2)];
  // Keep the result observable so the products cannot be optimized away.
  volatile float sink = c(0, 0);
  (void)sink;
  return per_gemm;
}

double measure_cpu_copy_bandwidth(std::size_t bytes, int repetitions) {
  std::vector<char> source(bytes, 1), destination(bytes, 0);
  std::memcpy(destination.data(), source.data(), bytes);  // untimed: page faults
  const auto begin = std::chrono::steady_clock::now();
  for (int i = 0; i < repetitions; ++i) {
    source[static_cast<std::size_t>(i) % bytes] = static_cast<char>(i);
    std::memcpy(destination.data(), source.data(), bytes);
  }
  const double seconds = seconds_since(begin);
  volatile char sink = destination[bytes / 2];
  (void)sink;
  return 2.0 * static_cast<double>(bytes) * repetitions / seconds;
}

double measure_cpu_adam_rate(std::size_t params, int repetitions) {
  const auto n = static_cast<Eigen::Index>(params);
  Eigen::ArrayXf p = Eigen::ArrayXf::Random(n), g = Eigen::ArrayXf::Random(n);
  Eigen::ArrayXf m = Eigen::ArrayXf::Zero(n), v = Eigen::ArrayXf::Zero(n);
  const float beta1 = 0.9f, beta2 = 0.999f, lr = 1e-3f, eps = 1e-8f;
  auto step = [&] {
    m = beta1 * m + (1 - beta1) * g;
    v = beta2 * v + (1 - beta2) * g.square();
    p -= lr * m / (v.sqrt() + eps);
  };
  step();  // untimed
  const auto begin = std::chrono::steady_clock::now();
  for (int i = 0; i < repetitions; ++i) step();
  const double seconds = seconds_since(begin);
  volatile float sink = p(0);
  (void)sink;
  return static_cast<double>(params) * repetitions / seconds;
}

std::vector<double> time_cpu_gemm_sequence(const std::vector<GemmShape>& shapes, int repetitions,
                                           const std::function<void()>& start_together) {
  struct Operands {
    Eigen::MatrixXf a, b, c;
  };
  std::vector<Operands> operands;
  operands.reserve(shapes.size());
  for (const auto& s : shapes)
    operands.push_back({Eigen::MatrixXf::Random(s.m, s.k), Eigen::MatrixXf::Random(s.k, s.n),
                        Eigen::MatrixXf(s.m, s.n)});
  auto run = [&] {
    for (auto& o : operands) o.c.noalias() = o.a * o.b;
  };
  run();  // untimed: first touch of the outputs, caches
  std::vector<double> times;
  for (int i = 0; i < repetitions; ++i) {
    start_together();
    const auto begin = std::chrono::steady_clock::now();
    run();
    times.push_back(seconds_since(begin));
  }
  volatile float sink = operands.empty() ? 0.f : operands.front().c(0, 0);
  (void)sink;
  return times;
}

}  // namespace shardplan::calibrate
