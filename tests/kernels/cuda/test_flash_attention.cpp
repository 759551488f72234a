// The flash attention kernels (kernels/cuda/flash_attention.hpp) on a CUDA device against the
// host kernels attention_forward / attention_backward of kernels/kernels.hpp run in double (the
// materialized probabilities): out, the saved log-sum-exp, and dq, dk, dv, which the backward
// adds. Skipped without a CUDA device (gpu_test_main.cpp).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "gpu_fixture.hpp"
#include "kernels/cuda/flash_attention.hpp"
#include "kernels/kernels.hpp"

namespace {

using namespace shardplan;
using namespace shardplan::executor;
using namespace shardplan::kernels;
using namespace shardplan::executor::testing;
using std::int64_t;

// fp32 against the double reference: |got − want| ≤ kTolerance·(1 + |want|). The kernels add up
// at most d = 256 products for a score and T = 130 terms for an output or gradient entry, each
// rounded to fp32 (unit roundoff 6e-8), and device expf/logf are within 2 ulp: the worst-case sum
// of relative errors is about (256 + 130)·6e-8 ≈ 2.3e-5 of the magnitudes involved (all O(1)
// here), so 1e-4 leaves a margin of 4 while any index or masking error (O(0.1) or more) fails.
constexpr double kTolerance = 1e-4;

struct Shape {
  int64_t batch, seq, heads, kv_heads, head_dim;
};

std::string describe(const Shape& s) {
  return "B=" + std::to_string(s.batch) + " T=" + std::to_string(s.seq) +
         " heads=" + std::to_string(s.heads) + " kv_heads=" + std::to_string(s.kv_heads) +
         " d=" + std::to_string(s.head_dim);
}

// T = 37 is not a multiple of the 32- or 16-row tiles (a partial last tile, keys past T); every
// supported head dim; kv_heads 2 of 4 (groups of 2). Then multi-head (groups of 1), groups of 3
// over several tiles at T = 130, and a single token.
std::vector<Shape> shapes() {
  std::vector<Shape> all;
  for (int64_t d : {16, 32, 64, 80, 96, 128, 256}) all.push_back({2, 37, 4, 2, d});
  all.push_back({2, 37, 4, 4, 64});
  all.push_back({1, 130, 6, 2, 64});
  all.push_back({1, 130, 3, 1, 256});
  all.push_back({3, 1, 2, 1, 32});
  return all;
}

void synchronize() {
  require_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  require_cuda(cudaGetLastError(), "a kernel");
}

std::vector<double> to_double(const std::vector<float>& x) { return {x.begin(), x.end()}; }

// The inputs of one shape: q, k in [−2, 2] (scores of standard deviation ≈ 4/3 after the
// 1/√d scale, so the softmax rows are far from uniform), v and dout in [−1, 1].
struct Inputs {
  std::vector<float> q, k, v, dout;
  explicit Inputs(const Shape& s) {
    const auto tokens = static_cast<std::size_t>(s.batch * s.seq);
    const auto q_size = tokens * static_cast<std::size_t>(s.heads * s.head_dim);
    const auto kv_size = tokens * static_cast<std::size_t>(s.kv_heads * s.head_dim);
    const auto seed = static_cast<std::uint32_t>(s.head_dim * 1000 + s.seq * 10 + s.heads);
    q = random_floats(static_cast<int64_t>(q_size), seed, -2.0f, 2.0f);
    k = random_floats(static_cast<int64_t>(kv_size), seed + 1, -2.0f, 2.0f);
    v = random_floats(static_cast<int64_t>(kv_size), seed + 2, -1.0f, 1.0f);
    dout = random_floats(static_cast<int64_t>(q_size), seed + 3, -1.0f, 1.0f);
  }
};

// The host kernels in double; lse from its definition, log Σ_{j ≤ t} exp(scale·q_t·k_j) with the
// maximum subtracted, summed here directly (not by the kernels under test).
struct Reference {
  std::vector<double> out, lse, dq, dk, dv;
  Reference(const Shape& s, const Inputs& in) {
    const std::vector<double> q = to_double(in.q), k = to_double(in.k), v = to_double(in.v),
                              dout = to_double(in.dout);
    const int64_t T = s.seq, d = s.head_dim, group = s.heads / s.kv_heads;
    out.assign(q.size(), 0.0);
    std::vector<double> probs(static_cast<std::size_t>(s.batch * s.heads * T * T));
    kernels::attention_forward(out.data(), probs.data(), q.data(), k.data(), v.data(), s.batch, T,
                               s.heads, s.kv_heads, d);
    dq.assign(q.size(), 0.0);
    dk.assign(k.size(), 0.0);
    dv.assign(v.size(), 0.0);
    std::vector<double> scratch(static_cast<std::size_t>(T * T));
    kernels::attention_backward(dq.data(), dk.data(), dv.data(), scratch.data(), dout.data(),
                                probs.data(), q.data(), k.data(), v.data(), s.batch, T, s.heads,
                                s.kv_heads, d);
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    lse.assign(static_cast<std::size_t>(s.batch * s.heads * T), 0.0);
    std::vector<double> scores(static_cast<std::size_t>(T));
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t h = 0; h < s.heads; ++h)
        for (int64_t t = 0; t < T; ++t) {
          const double* qt = q.data() + ((b * T + t) * s.heads + h) * d;
          for (int64_t j = 0; j <= t; ++j) {
            const double* kj = k.data() + ((b * T + j) * s.kv_heads + h / group) * d;
            double dot = 0;
            for (int64_t c = 0; c < d; ++c) dot += qt[c] * kj[c];
            scores[static_cast<std::size_t>(j)] = scale * dot;
          }
          const double max = *std::max_element(scores.begin(), scores.begin() + t + 1);
          double sum = 0;
          for (int64_t j = 0; j <= t; ++j)
            sum += std::exp(scores[static_cast<std::size_t>(j)] - max);
          lse[static_cast<std::size_t>((b * s.heads + h) * T + t)] = max + std::log(sum);
        }
  }
};

// Every entry within the tolerance of factor·want; reports the count and the worst entry.
void expect_close(const char* what, const std::vector<float>& got, const std::vector<double>& want,
                  double factor = 1.0) {
  REQUIRE(got.size() == want.size());
  std::size_t wrong = 0, worst = 0;
  double worst_error = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double expected = factor * want[i];
    const double error = std::abs(static_cast<double>(got[i]) - expected);
    if (!(error <= kTolerance * (1.0 + std::abs(expected))))  // NaN counts as wrong
      ++wrong;
    if (!(error <= worst_error)) {
      worst_error = error;
      worst = i;
    }
  }
  INFO(std::string(what) << ": " << wrong << " of " << got.size() << " entries off; worst |error| "
                         << worst_error << " at " << worst << ": got " << got[worst] << ", want "
                         << factor * want[worst]);
  CHECK(wrong == 0);
}

}  // namespace

TEST_CASE("kernels::cuda flash attention forward matches the host kernel") {
  for (const Shape& s : shapes()) {
    INFO(describe(s));
    const Inputs in(s);
    const Reference ref(s, in);
    DeviceArray<float> q(in.q), k(in.k), v(in.v), out(in.q.size()),
        lse(static_cast<std::size_t>(s.batch * s.heads * s.seq));
    kernels::cuda::flash_attention_forward(nullptr, out.get(), lse.get(), q.get(), k.get(), v.get(),
                                           s.batch, s.seq, s.heads, s.kv_heads, s.head_dim);
    synchronize();
    expect_close("out", out.download(), ref.out);
    expect_close("lse", lse.download(), ref.lse);
  }
}

TEST_CASE("kernels::cuda flash attention backward matches the host kernel and adds") {
  for (const Shape& s : shapes()) {
    INFO(describe(s));
    const Inputs in(s);
    const Reference ref(s, in);
    const auto stats = static_cast<std::size_t>(s.batch * s.heads * s.seq);
    DeviceArray<float> q(in.q), k(in.k), v(in.v), dout(in.dout), out(in.q.size()), lse(stats),
        delta(stats), dq(in.q.size()), dk(in.k.size()), dv(in.v.size());
    kernels::cuda::flash_attention_forward(nullptr, out.get(), lse.get(), q.get(), k.get(), v.get(),
                                           s.batch, s.seq, s.heads, s.kv_heads, s.head_dim);
    dq.zero();
    dk.zero();
    dv.zero();
    for (int pass = 1; pass <= 2; ++pass) {  // the second pass adds as much again: twice
      INFO("pass " << pass);
      kernels::cuda::flash_attention_backward(
          nullptr, dq.get(), dk.get(), dv.get(), delta.get(), dout.get(), out.get(), lse.get(),
          q.get(), k.get(), v.get(), s.batch, s.seq, s.heads, s.kv_heads, s.head_dim);
      synchronize();
      expect_close("dq", dq.download(), ref.dq, pass);
      expect_close("dk", dk.download(), ref.dk, pass);
      expect_close("dv", dv.download(), ref.dv, pass);
    }
  }
}

TEST_CASE("kernels::cuda flash attention rejects what it cannot take") {
  CHECK(kernels::cuda::flash_attention_supports(64));
  CHECK(kernels::cuda::flash_attention_supports(256));
  CHECK_FALSE(kernels::cuda::flash_attention_supports(72));
  CHECK_FALSE(kernels::cuda::flash_attention_supports(512));
  DeviceArray<float> x(4096);
  float* p = x.get();
  CHECK_THROWS_WITH_AS(
      kernels::cuda::flash_attention_forward(nullptr, p, p, p, p, p, 1, 4, 2, 1, 72),
      doctest::Contains("head_dim 72"), std::runtime_error);
  CHECK_THROWS_WITH_AS(kernels::cuda::flash_attention_backward(nullptr, p, p, p, p, p, p, p, p, p,
                                                               p, 1, 4, 6, 4, 16),
                       doctest::Contains("kv_heads 4"), std::runtime_error);
  // Empty batches queue nothing.
  CHECK_NOTHROW(kernels::cuda::flash_attention_forward(nullptr, p, p, p, p, p, 0, 4, 2, 1, 64));
  CHECK_NOTHROW(kernels::cuda::flash_attention_backward(nullptr, p, p, p, p, p, p, p, p, p, p, 2, 0,
                                                        2, 1, 64));
  synchronize();
}
