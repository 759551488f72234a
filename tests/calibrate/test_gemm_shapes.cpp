#include <doctest/doctest.h>

#include <algorithm>
#include <vector>

#include "calibrate/gemm_shapes.hpp"
#include "documents/model.hpp"

using namespace shardplan;
using namespace shardplan::calibrate;

namespace {

double weighted_flops(const std::vector<GemmShape>& shapes) {
  double f = 0;
  for (const auto& s : shapes) f += static_cast<double>(s.count) * s.flops();
  return f;
}

}  // namespace

TEST_CASE("gemm_shapes::one step's GEMMs are 6 FLOPs per token per matrix parameter") {
  // llama-2-7b (config.json: hidden 4096, intermediate 11008, 32 layers, vocab 32000, untied):
  // a block's matrices are q, k, v, o (4 x 4096²) and gate, up, down (3 x 4096 x 11008):
  // 202,375,168 parameters; the head 32000 x 4096 = 131,072,000. Forward 2, backward 4 FLOPs per
  // token per parameter (Kaplan et al. 2020, C = 6N per token).
  const auto m = documents::load_model("llama-2-7b");
  const std::int64_t tokens = 4096;
  const auto shapes = model_gemm_shapes(m, tokens);
  const double params = 32.0 * 202'375'168 + 131'072'000;
  CHECK(weighted_flops(shapes) == doctest::Approx(6.0 * tokens * params).epsilon(1e-12));
  CHECK(std::find_if(shapes.begin(), shapes.end(), [](const GemmShape& s) {
          return s.m == 32000 && s.n == 4096 && s.k == tokens && s.count == 1;
        }) != shapes.end());  // the head's weight gradient
}

TEST_CASE("gemm_shapes::a tied head is the embedding matrix") {
  // GPT-2: wte [50257, 768] is also the head; learned positions [1024, 768] are not a GEMM.
  const auto m = documents::load_model("gpt2");
  const auto shapes = model_gemm_shapes(m, 1024);
  CHECK(std::find_if(shapes.begin(), shapes.end(), [](const GemmShape& s) {
          return s.m == 1024 && s.n == 50257 && s.k == 768;
        }) != shapes.end());
  CHECK(std::find_if(shapes.begin(), shapes.end(), [](const GemmShape& s) {
          return s.n == 1024 && s.k == 768 && s.m == 1024;
        }) == shapes.end());
}

TEST_CASE("gemm_shapes::the model rate weights each shape by its count") {
  // Two shapes: 2 GFLOP once in 1 s, 1 GFLOP three times in 0.5 s each: 5 GFLOP in 2.5 s.
  std::vector<GemmMeasurement> g = {
      {{1000, 1000, 1000, 1}, documents::DType::fp32, 1.0, true},
      {{1000, 1000, 500, 3}, documents::DType::fp32, 0.5, true},
      {{4096, 4096, 4096, 1}, documents::DType::fp32, 0.1, false}};  // square: not the model's
  CHECK(model_gemm_rate(g, documents::DType::fp32) == doctest::Approx(5e9 / 2.5));
  CHECK(model_gemm_rate(g, documents::DType::bf16) == 0);
}
