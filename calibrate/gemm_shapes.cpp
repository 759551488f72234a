#include "calibrate/gemm_shapes.hpp"

#include <algorithm>

namespace shardplan::calibrate {

std::vector<GemmShape> model_gemm_shapes(const documents::ModelSpec& model, std::int64_t tokens) {
  std::vector<GemmShape> shapes;
  auto add = [&](const GemmShape& s) {
    const auto it = std::find_if(shapes.begin(), shapes.end(),
                                 [&](const GemmShape& o) { return o.same_dims(s); });
    if (it == shapes.end())
      shapes.push_back(s);
    else
      it->count += s.count;
  };
  auto linear = [&](std::int64_t out, std::int64_t in, std::int64_t count, bool head) {
    add({tokens, out, in, count, head});  // y = x·Wᵀ
    add({tokens, in, out, count, head});  // dx = dy·W
    add({out, in, tokens, count, head});  // dW = dyᵀ·x
  };
  for (const auto& t : model.block.tensors)
    if (t.is_matrix()) linear(t.rows, t.cols, model.layers, false);
  // The head's projection: its own matrix, or the embedding matrix it is tied to.
  const auto& head = model.tied_embeddings ? model.embedding.tensors : model.head.tensors;
  for (const auto& t : head)
    if (t.is_matrix()) {
      linear(t.rows, t.cols, 1, true);
      break;
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
