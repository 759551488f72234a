#include "calibrate/gemm_shapes.hpp"

#include <algorithm>

namespace shardplan::calibrate {

std::vector<GemmShape> model_gemm_shapes(const costmodel::ModelSpec& model, std::int64_t tokens) {
  std::vector<GemmShape> shapes;
  for (const auto& t : model.block.tensors) {
    if (!t.is_matrix())
      continue;
    const GemmShape s{tokens, t.rows, t.cols};
    if (std::find(shapes.begin(), shapes.end(), s) == shapes.end())
      shapes.push_back(s);
  }
  return shapes;
}

std::vector<GemmShape> square_gemm_shapes(bool gpu) {
  std::vector<GemmShape> shapes;
  for (std::int64_t n :
       gpu ? std::vector<std::int64_t>{4096, 8192} : std::vector<std::int64_t>{256, 512})
    shapes.push_back({n, n, n});
  return shapes;
}

double model_gemm_rate(const std::vector<GemmMeasurement>& measurements, costmodel::DType dtype) {
  double flops = 0, seconds = 0;
  for (const auto& g : measurements) {
    if (!g.model_shape || g.dtype != dtype)
      continue;
    flops += g.shape.flops();
    seconds += g.time_s;
  }
  return seconds > 0 ? flops / seconds : 0.0;
}

double best_gemm_rate(const std::vector<GemmMeasurement>& measurements, costmodel::DType dtype) {
  double best = 0;
  for (const auto& g : measurements)
    if (g.dtype == dtype)
      best = std::max(best, g.flops_per_s());
  return best;
}

} // namespace shardplan::calibrate
