#include <doctest/doctest.h>

#include <cmath>

#include "calibrate/elementwise_bench.hpp"

using namespace shardplan;
using namespace shardplan::calibrate;
using shardplan::documents::ElementwiseKind;

TEST_CASE("elementwise_bench::a step's layers: a block's times its layers, the head's once") {
  const auto m = documents::load_model("gpt2");  // 12 blocks
  const auto ops = model_elementwise_ops(m);
  const auto block = documents::passes_per_token(documents::block_elementwise_ops(m));
  const auto head = documents::passes_per_token(documents::head_elementwise_ops(m));
  const auto emb = documents::passes_per_token(documents::embedding_elementwise_ops(m));
  const auto all = documents::passes_per_token(ops);
  CHECK(all.forward == 12 * block.forward + head.forward + emb.forward);
  CHECK(all.backward == 12 * block.backward + head.backward + emb.backward);
}

TEST_CASE("elementwise_bench::every kind runs and gives a finite rate") {
  for (auto kind : {ElementwiseKind::layernorm, ElementwiseKind::rmsnorm, ElementwiseKind::residual,
                    ElementwiseKind::rotary, ElementwiseKind::gelu, ElementwiseKind::swiglu,
                    ElementwiseKind::embedding, ElementwiseKind::log_softmax}) {
    CAPTURE(documents::elementwise_kind_name(kind));
    const double rate = time_cpu_elementwise_rate({{kind, 256, 1}}, 64, 32, 1e-4);
    CHECK(std::isfinite(rate));
    CHECK(rate > 1e6);  // any CPU makes a million passes a second over 16K elements
  }
  // Nothing to time: no rate.
  CHECK(time_cpu_elementwise_rate({}, 64, 32) == 0);
  CHECK(time_cpu_elementwise_rate({{ElementwiseKind::gelu, 0, 1}}, 64, 32) == 0);
}
