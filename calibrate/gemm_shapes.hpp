// The GEMMs whose throughput the compute model needs: those of one training step of the model
// (its workload's, documents/workload.hpp: each linear layer's forward and two backward GEMMs,
// counted as often as a step runs them, once per block for a block's matrices, once for the
// head), and square ones that show the device's best rate.
#pragma once

#include <cstdint>
#include <vector>

#include "documents/hardware.hpp"
#include "documents/model.hpp"
#include "documents/workload.hpp"

namespace shardplan::calibrate {

struct GemmShape {
  std::int64_t m = 0, n = 0, k = 0;
  std::int64_t count = 1;  // how many times one forward and backward runs it (model shapes)
  bool head = false;       // the head's projection only (not a transformer block's)
  bool same_dims(const GemmShape& o) const { return m == o.m && n == o.n && k == o.k; }
  double flops() const {
    return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  }
};

struct GemmMeasurement {
  GemmShape shape;
  documents::DType dtype = documents::DType::fp32;
  double time_s = 0;         // per GEMM (the slowest rank's, once combined over ranks)
  bool model_shape = false;  // one of the model's block GEMMs, not a square one
  double flops_per_s() const { return shape.flops() / time_s; }
};

std::vector<GemmShape> model_gemm_shapes(const documents::ModelSpec& model, std::int64_t tokens);
// Square sizes: 256 and 512 on a CPU (one core per rank); 4096 and 8192 on a GPU.
std::vector<GemmShape> square_gemm_shapes(bool gpu);

// FLOP/s of the model-shape GEMMs of `dtype` together (their FLOPs over their time, each shape
// weighted by its count); 0 if none.
double model_gemm_rate(const std::vector<GemmMeasurement>& measurements, documents::DType dtype);
// Best FLOP/s of any GEMM of `dtype`; 0 if none.
double best_gemm_rate(const std::vector<GemmMeasurement>& measurements, documents::DType dtype);

}  // namespace shardplan::calibrate
