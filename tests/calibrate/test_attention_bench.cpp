#include <doctest/doctest.h>

#include <cmath>

#include "calibrate/attention_bench.hpp"

using namespace shardplan;
using namespace shardplan::calibrate;

TEST_CASE("attention_bench::the model's core: whole sequences of the tokens, its heads") {
  const auto m = documents::load_model("llama-3-8b");  // 32 query heads, 8 key/value, 128 wide
  const auto a = model_attention_shape(m, 4096, 1024);
  CHECK(a.batch == 4);
  CHECK(a.seq == 1024);
  CHECK(a.heads == 32);
  CHECK(a.kv_heads == 8);
  CHECK(a.head_dim == 128);
}

TEST_CASE("attention_bench::a CPU rank times the host backend's fp32 eager and flash attention") {
  int calls = 0;
  const auto samples = time_cpu_attention({2, 16, 4, 2, 8}, 1e-4, [&] { ++calls; });
  REQUIRE(samples.size() == 2);  // eager, then the host's tiled flash attention
  CHECK(samples[1].impl == "flash");
  CHECK(samples[1].forward_s > 0);
  CHECK(samples[1].backward_s > 0);
  const auto& s = samples.front();
  CHECK(s.impl == "eager");
  CHECK(s.dtype == documents::DType::fp32);
  CHECK(s.batch == 2);
  CHECK(s.seq == 16);
  CHECK(s.heads == 4);
  CHECK(s.kv_heads == 2);
  CHECK(s.head_dim == 8);
  CHECK(std::isfinite(s.forward_s));
  CHECK(s.forward_s > 0);
  CHECK(std::isfinite(s.backward_s));
  CHECK(s.backward_s > 0);
  CHECK(calls == 2);  // once before each implementation
}
