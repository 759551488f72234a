#include "calibrate/gemm_shapes.hpp"

#include <algorithm>

namespace shardplan::calibrate {

std::vector<GemmShape> model_gemm_shapes(const documents::ModelSpec& model, std::int64_t tokens) {
  std::vector<GemmShape> shapes;
  auto add = [&](const documents::Gemm& g, std::int64_t count, bool head) {
    const GemmShape s{g.m, g.n, g.k, count, head};
    const auto it = std::find_if(shapes.begin(), shapes.end(),
                                 [&](const GemmShape& o) { return o.same_dims(s); });
    if (it == shapes.end())
      shapes.push_back(s);
    else
      it->count += s.count;
  };
  // Each forward GEMM of the step's workload, then its two backward ones: a block's once per
  // block, the head's projection once.
  for (const auto unit : {documents::UnitKind::block, documents::UnitKind::head}) {
    const bool head = unit == documents::UnitKind::head;
    const std::int64_t count = head ? 1 : model.layers;
    for (const auto& f : documents::forward_gemms(model, unit, tokens)) {
      add(f, count, head);
      for (const auto& b : documents::backward_gemms(f)) add(b, count, head);
    }
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

double model_gemm_rate(const std::vector<GemmMeasurement>& measurements, documents::DType dtype) {
  double flops = 0, seconds = 0;
  for (const auto& g : measurements) {
    if (!g.model_shape || g.dtype != dtype) continue;
    const auto count = static_cast<double>(g.shape.count);
    flops += count * g.shape.flops();
    seconds += count * g.time_s;
  }
  return seconds > 0 ? flops / seconds : 0.0;
}

double best_gemm_rate(const std::vector<GemmMeasurement>& measurements, documents::DType dtype) {
  double best = 0;
  for (const auto& g : measurements)
    if (g.dtype == dtype) best = std::max(best, g.flops_per_s());
  return best;
}

}  // namespace shardplan::calibrate
