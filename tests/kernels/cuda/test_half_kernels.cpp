// The GPU kernels in bf16 and f16 (kernels/cuda/device_kernels.hpp, flash_attention.hpp) against
// the same kernels in fp32 on the GPU, on the same inputs: random floats rounded to the 16-bit
// type, handed to the 16-bit kernel as they are and to the fp32 kernel widened (exactly). Both
// compute in fp32, so what separates them is the 16-bit kernel's roundings of what it stores, which
// the tolerances below count. The fp32 kernels are checked against the host's in
// test_device_kernels.cpp and test_flash_attention.cpp. Skipped without a CUDA device
// (gpu_test_main.cpp).
//
// Tolerances. u is the unit roundoff, 2⁻⁸ for bf16 (8 significant bits) and 2⁻¹¹ for f16 (11):
// rounding x to nearest moves it by at most u·|x| (f16's subnormals, below 2⁻¹⁴, by at most 2⁻²⁵
// absolutely, which the floor covers). Element i of a result passes when
//   |got_i − want_i| ≤ c·u·(|want_i| + m_i) + floor·max_j |want_j|
// where c·u·(|want_i| + m_i) bounds the 16-bit kernel's roundings to first order in u (m_i the
// magnitude of what was rounded on the way, from the inputs' absolute values) and the floor the
// fp32 arithmetic's own differences between the two (another summation order: k·2⁻²⁴·Σ|terms| for
// k terms, ≤ 1e-4 of the result's scale for the sums here, as in test_device_kernels.cpp; kernels
// whose fp32 arithmetic is the same on both sides get 1e-6). Per kernel:
//   - one rounding of the value the fp32 kernel computes (element-wise kernels, the norms, rope,
//     the embedding, log_softmax_backward, add; the bias and norm-weight gradients, summed in fp32
//     in another order): c = 1, m = 0;
//   - GEMMs (linear): cuBLAS with fp32 accumulation rounds C once; the bias goes in first (one more
//     rounding when accumulating), and cuBLAS may reduce split-K partial sums in the output type
//     (PyTorch's allow_bf16_reduced_precision_reduction): each of these roundings moves a value of
//     at most |y0| + |b| + Σ|x||w| =: m, so c = 3;
//   - eager attention and flash attention: the bounds derived at attention_bounds below, doubled
//     for a margin over the first-order terms.
// An index, masking or accumulation error moves an element by O(1) of its scale: 2·u·(the scale)
// is at most 0.8% of it for bf16.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "gpu_fixture.hpp"
#include "kernels/cuda/device_kernels.hpp"
#include "kernels/cuda/flash_attention.hpp"
#include "kernels/scalar.hpp"

TYPE_TO_STRING_AS("bf16", shardplan::kernels::bf16);
TYPE_TO_STRING_AS("f16", shardplan::kernels::f16);

namespace {

using shardplan::kernels::bf16;
using shardplan::kernels::f16;
namespace dev = shardplan::kernels::cuda;
using namespace shardplan::executor::testing;
using Doubles = std::vector<double>;

constexpr double kSameArithmetic = 1e-6;  // floor: the same fp32 operations on both sides
constexpr double kReordered = 1e-4;       // floor: fp32 sums in another order

template <class S>
constexpr double kUnitRoundoff = std::is_same_v<S, bf16> ? 1.0 / 256 : 1.0 / 2048;
template <class S> constexpr const char* kName = std::is_same_v<S, bf16> ? "bf16" : "f16";

template <class S> std::vector<S> narrowed(const Floats& x) {
  std::vector<S> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = shardplan::kernels::narrow<S>(x[i]);
  return out;
}

template <class S> Floats widened(const std::vector<S>& x) {
  Floats out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = shardplan::kernels::widen(x[i]);
  return out;
}

// Random values on both sides: `half` for the 16-bit kernel, `full` (the same numbers, exactly) for
// the fp32 one.
template <class S> struct Input {
  DeviceArray<S> half;
  DeviceArray<float> full;
  Floats values;  // on the host
  explicit Input(const Floats& x) : Input(narrowed<S>(x)) {}
  explicit Input(const std::vector<S>& rounded)
      : half(rounded), full(widened(rounded)), values(widened(rounded)) {}
};

template <class S>
Input<S> random_input(std::int64_t count, unsigned seed, float low = -1.0f, float high = 1.0f) {
  return Input<S>(random_floats(count, seed, low, high));
}

// |got_i − want_i| ≤ c·u·(|want_i| + magnitude_i) + floor·max|want| (the top of the file);
// magnitude empty: zeros.
void check_within(const Floats& got, const Floats& want, double c_u, const Doubles& magnitude,
                  double floor, const std::string& what) {
  REQUIRE(got.size() == want.size());
  REQUIRE((magnitude.empty() || magnitude.size() == want.size()));
  check_elements(got, want, what, [&](double got_i, double want_i, std::size_t i, double scale) {
    const double m = magnitude.empty() ? 0.0 : magnitude[i];
    const double bound = c_u * (std::fabs(want_i) + m) + floor * scale;
    return std::fabs(got_i - want_i) <= bound;
  });
}

// One rounding of the fp32 kernel's value.
template <class S>
void check_rounded(const DeviceArray<S>& got, const DeviceArray<float>& want, double floor,
                   const std::string& what) {
  check_within(widened(got.download()), want.download(), kUnitRoundoff<S>, {}, floor,
               std::string(kName<S>) + " " + what);
}

// Σ|a||b| of a product y = a·bᵀ as the linear layer forms it: a [n, k], b [m, k] → [n, m].
Doubles abs_products(const Floats& a, const Floats& b, std::int64_t n, std::int64_t k,
                     std::int64_t m) {
  Doubles out(static_cast<std::size_t>(n * m), 0.0);
  for (std::int64_t r = 0; r < n; ++r)
    for (std::int64_t o = 0; o < m; ++o) {
      double sum = 0.0;
      for (std::int64_t i = 0; i < k; ++i)
        sum += std::fabs(static_cast<double>(a[static_cast<std::size_t>(r * k + i)]) *
                         static_cast<double>(b[static_cast<std::size_t>(o * k + i)]));
      out[static_cast<std::size_t>(r * m + o)] = sum;
    }
  return out;
}

Floats transposed(const Floats& x, std::int64_t rows, std::int64_t cols) {
  Floats t(x.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      t[static_cast<std::size_t>(c * rows + r)] = x[static_cast<std::size_t>(r * cols + c)];
  return t;
}

}  // namespace

TEST_CASE_TEMPLATE("kernels::cuda 16-bit embedding is the fp32 one rounded", S, bf16, f16) {
  Gpu gpu;
  struct Shape {
    std::int64_t batch, seq, channels;
  };
  // Five distinct tokens over 14 and 150 rows (a token's rows found across several 32-row scans),
  // 1100 channels: two passes of 1024 columns in the 16-bit backward.
  for (const Shape s : {Shape{2, 7, 33}, Shape{3, 50, 1100}}) {
    CAPTURE(s.channels);
    const std::int64_t B = s.batch, T = s.seq, C = s.channels, V = 37, P = T + 3, N = B * T;
    const Tokens tokens = random_tokens(N, 5, 1);
    DeviceArray<std::int32_t> d_tokens(tokens);
    auto wte = random_input<S>(V * C, 2), wpe = random_input<S>(P * C, 3);
    for (const bool positions : {true, false}) {
      CAPTURE(positions);
      DeviceArray<S> out(static_cast<std::size_t>(N * C));
      DeviceArray<float> want(static_cast<std::size_t>(N * C));
      dev::embedding_forward(gpu.launch(), out.get(), d_tokens.get(), wte.half.get(),
                             positions ? wpe.half.get() : nullptr, B, T, C);
      dev::embedding_forward(gpu.launch(), want.get(), d_tokens.get(), wte.full.get(),
                             positions ? wpe.full.get() : nullptr, B, T, C);
      gpu.finish();
      check_rounded(out, want, kSameArithmetic, "out");

      auto dout = random_input<S>(N * C, 5), dwte = random_input<S>(V * C, 6),
           dwpe = random_input<S>(P * C, 7);
      dev::embedding_backward(gpu.launch(), dwte.half.get(), positions ? dwpe.half.get() : nullptr,
                              dout.half.get(), d_tokens.get(), B, T, C);
      dev::embedding_backward(gpu.launch(), dwte.full.get(), positions ? dwpe.full.get() : nullptr,
                              dout.full.get(), d_tokens.get(), B, T, C);
      gpu.finish();
      check_rounded(dwte.half, dwte.full, kReordered, "dwte");
      check_rounded(dwpe.half, dwpe.full, kSameArithmetic, "dwpe");
    }
  }
}

TEST_CASE_TEMPLATE("kernels::cuda 16-bit linear layers are the fp32 ones within the GEMM's "
                   "roundings",
                   S, bf16, f16) {
  Gpu gpu;
  constexpr double kGemm = 3 * kUnitRoundoff<S>;  // the top of the file
  struct Shape {
    std::int64_t n, in, out;
  };
  for (const Shape s : {Shape{14, 33, 37}, Shape{300, 70, 45}}) {
    CAPTURE(s.n);
    auto x = random_input<S>(s.n * s.in, 11), w = random_input<S>(s.out * s.in, 12),
         b = random_input<S>(s.out, 13);
    const Doubles xw = abs_products(x.values, w.values, s.n, s.in, s.out);
    for (const bool accumulate : {false, true})
      for (const bool bias : {false, true}) {
        CAPTURE(accumulate);
        CAPTURE(bias);
        auto y = random_input<S>(s.n * s.out, 14);
        Doubles magnitude = xw;
        for (std::size_t i = 0; i < magnitude.size(); ++i)
          magnitude[i] +=
              (accumulate ? std::fabs(static_cast<double>(y.values[i])) : 0.0) +
              (bias ? std::fabs(static_cast<double>(b.values[i % static_cast<std::size_t>(s.out)]))
                    : 0.0);
        dev::linear_forward(gpu.launch(), y.half.get(), x.half.get(), w.half.get(),
                            bias ? b.half.get() : nullptr, s.n, s.in, s.out, accumulate);
        dev::linear_forward(gpu.launch(), y.full.get(), x.full.get(), w.full.get(),
                            bias ? b.full.get() : nullptr, s.n, s.in, s.out, accumulate);
        gpu.finish();
        check_within(widened(y.half.download()), y.full.download(), kGemm, magnitude, kReordered,
                     std::string(kName<S>) + " y");
      }

    auto dy = random_input<S>(s.n * s.out, 21);
    // dx [n, in] = dy [n, out]·w [out, in]: Σ_o |dy||w|; dw [out, in] = dyᵀ·x: Σ_r |dy||x|.
    const Doubles dyw =
        abs_products(dy.values, transposed(w.values, s.out, s.in), s.n, s.out, s.in);
    const Doubles dyx = abs_products(transposed(dy.values, s.n, s.out),
                                     transposed(x.values, s.n, s.in), s.out, s.n, s.in);
    for (const bool with_dx : {true, false})
      for (const bool with_db : {true, false}) {
        CAPTURE(with_dx);
        CAPTURE(with_db);
        auto dx = random_input<S>(s.n * s.in, 24), dw = random_input<S>(s.out * s.in, 25),
             db = random_input<S>(s.out, 26);
        Doubles mag_dx = dyw, mag_dw = dyx;
        for (std::size_t i = 0; i < mag_dx.size(); ++i)
          mag_dx[i] += std::fabs(static_cast<double>(dx.values[i]));
        for (std::size_t i = 0; i < mag_dw.size(); ++i)
          mag_dw[i] += std::fabs(static_cast<double>(dw.values[i]));
        dev::linear_backward(gpu.launch(), with_dx ? dx.half.get() : nullptr, dw.half.get(),
                             with_db ? db.half.get() : nullptr, dy.half.get(), x.half.get(),
                             w.half.get(), s.n, s.in, s.out);
        dev::linear_backward(gpu.launch(), with_dx ? dx.full.get() : nullptr, dw.full.get(),
                             with_db ? db.full.get() : nullptr, dy.full.get(), x.full.get(),
                             w.full.get(), s.n, s.in, s.out);
        gpu.finish();
        check_within(widened(dx.half.download()), dx.full.download(), kGemm, mag_dx, kReordered,
                     std::string(kName<S>) + " dx");
        check_within(widened(dw.half.download()), dw.full.download(), kGemm, mag_dw, kReordered,
                     std::string(kName<S>) + " dw");
        check_rounded(db.half, db.full, kReordered, "db");
      }
  }
}

TEST_CASE_TEMPLATE("kernels::cuda 16-bit layernorm and rmsnorm are the fp32 ones rounded", S, bf16,
                   f16) {
  Gpu gpu;
  struct Shape {
    std::int64_t n, channels;
  };
  const float eps = 1e-5f;
  for (const Shape s : {Shape{14, 33}, Shape{300, 70}}) {
    CAPTURE(s.n);
    const std::int64_t n = s.n, c = s.channels;
    auto x = random_input<S>(n * c, 41, -2.0f, 3.0f), w = random_input<S>(c, 42),
         b = random_input<S>(c, 43), dy = random_input<S>(n * c, 44);
    DeviceArray<S> y(static_cast<std::size_t>(n * c));
    DeviceArray<float> y_full(static_cast<std::size_t>(n * c));
    DeviceArray<float> mean(static_cast<std::size_t>(n)), rstd(static_cast<std::size_t>(n)),
        mean_full(static_cast<std::size_t>(n)), rstd_full(static_cast<std::size_t>(n));
    // The statistics are fp32 from the same values in the same order: equal but for the last bit.
    const auto check_stats = [&](const char* what, const DeviceArray<float>& got,
                                 const DeviceArray<float>& want) {
      check_within(got.download(), want.download(), 0.0, {}, kSameArithmetic,
                   std::string(kName<S>) + " " + what);
    };

    dev::layernorm_forward(gpu.launch(), y.get(), mean.get(), rstd.get(), x.half.get(),
                           w.half.get(), b.half.get(), n, c, eps);
    dev::layernorm_forward(gpu.launch(), y_full.get(), mean_full.get(), rstd_full.get(),
                           x.full.get(), w.full.get(), b.full.get(), n, c, eps);
    gpu.finish();
    check_rounded(y, y_full, kSameArithmetic, "layernorm y");
    check_stats("layernorm mean", mean, mean_full);
    check_stats("layernorm rstd", rstd, rstd_full);
    {
      auto dx = random_input<S>(n * c, 45), dw = random_input<S>(c, 46),
           db = random_input<S>(c, 47);
      // Both read the fp32 kernel's statistics.
      dev::layernorm_backward(gpu.launch(), dx.half.get(), dw.half.get(), db.half.get(),
                              dy.half.get(), x.half.get(), w.half.get(), mean_full.get(),
                              rstd_full.get(), n, c);
      dev::layernorm_backward(gpu.launch(), dx.full.get(), dw.full.get(), db.full.get(),
                              dy.full.get(), x.full.get(), w.full.get(), mean_full.get(),
                              rstd_full.get(), n, c);
      gpu.finish();
      check_rounded(dx.half, dx.full, kSameArithmetic, "layernorm dx");
      check_rounded(dw.half, dw.full, kReordered, "layernorm dw");
      check_rounded(db.half, db.full, kReordered, "layernorm db");
    }

    dev::rmsnorm_forward(gpu.launch(), y.get(), rstd.get(), x.half.get(), w.half.get(), n, c, eps);
    dev::rmsnorm_forward(gpu.launch(), y_full.get(), rstd_full.get(), x.full.get(), w.full.get(), n,
                         c, eps);
    gpu.finish();
    check_rounded(y, y_full, kSameArithmetic, "rmsnorm y");
    check_stats("rmsnorm rstd", rstd, rstd_full);
    {
      auto dx = random_input<S>(n * c, 48), dw = random_input<S>(c, 49);
      dev::rmsnorm_backward(gpu.launch(), dx.half.get(), dw.half.get(), dy.half.get(), x.half.get(),
                            w.half.get(), rstd_full.get(), n, c);
      dev::rmsnorm_backward(gpu.launch(), dx.full.get(), dw.full.get(), dy.full.get(), x.full.get(),
                            w.full.get(), rstd_full.get(), n, c);
      gpu.finish();
      check_rounded(dx.half, dx.full, kSameArithmetic, "rmsnorm dx");
      check_rounded(dw.half, dw.full, kReordered, "rmsnorm dw");
    }
  }
}

TEST_CASE_TEMPLATE("kernels::cuda 16-bit rotary positions are the fp32 ones rounded", S, bf16,
                   f16) {
  Gpu gpu;
  const std::int64_t batch = 2, seq = 300, heads = 3, head_dim = 8;
  const double theta = 10000.0;
  auto x = random_input<S>(batch * seq * heads * head_dim, 51);
  auto dx = random_input<S>(batch * seq * heads * head_dim, 52);
  dev::rope_forward(gpu.launch(), x.half.get(), batch, seq, heads, head_dim, theta);
  dev::rope_forward(gpu.launch(), x.full.get(), batch, seq, heads, head_dim, theta);
  dev::rope_backward(gpu.launch(), dx.half.get(), batch, seq, heads, head_dim, theta);
  dev::rope_backward(gpu.launch(), dx.full.get(), batch, seq, heads, head_dim, theta);
  gpu.finish();
  check_rounded(x.half, x.full, kSameArithmetic, "rope forward");
  check_rounded(dx.half, dx.full, kSameArithmetic, "rope backward");
}

TEST_CASE_TEMPLATE("kernels::cuda 16-bit gelu and swiglu are the fp32 ones rounded", S, bf16, f16) {
  Gpu gpu;
  const std::int64_t n = 1001;
  auto a = random_input<S>(n, 71, -5.0f, 5.0f), b = random_input<S>(n, 72, -5.0f, 5.0f),
       dout = random_input<S>(n, 73);
  DeviceArray<S> out(static_cast<std::size_t>(n));
  DeviceArray<float> want(static_cast<std::size_t>(n));

  dev::gelu_forward(gpu.launch(), out.get(), a.half.get(), n);
  dev::gelu_forward(gpu.launch(), want.get(), a.full.get(), n);
  gpu.finish();
  check_rounded(out, want, kSameArithmetic, "gelu");
  {
    auto din = random_input<S>(n, 74);
    dev::gelu_backward(gpu.launch(), din.half.get(), a.half.get(), dout.half.get(), n);
    dev::gelu_backward(gpu.launch(), din.full.get(), a.full.get(), dout.full.get(), n);
    gpu.finish();
    check_rounded(din.half, din.full, kSameArithmetic, "gelu din");
  }

  dev::swiglu_forward(gpu.launch(), out.get(), a.half.get(), b.half.get(), n);
  dev::swiglu_forward(gpu.launch(), want.get(), a.full.get(), b.full.get(), n);
  gpu.finish();
  check_rounded(out, want, kSameArithmetic, "swiglu");
  {
    auto dgate = random_input<S>(n, 75), dup = random_input<S>(n, 76);
    dev::swiglu_backward(gpu.launch(), dgate.half.get(), dup.half.get(), dout.half.get(),
                         a.half.get(), b.half.get(), n);
    dev::swiglu_backward(gpu.launch(), dgate.full.get(), dup.full.get(), dout.full.get(),
                         a.full.get(), b.full.get(), n);
    gpu.finish();
    check_rounded(dgate.half, dgate.full, kSameArithmetic, "swiglu dgate");
    check_rounded(dup.half, dup.full, kSameArithmetic, "swiglu dup");
  }
}

TEST_CASE_TEMPLATE("kernels::cuda 16-bit logits give the fp32 log_softmax", S, bf16, f16) {
  Gpu gpu;
  const std::int64_t n = 14;
  for (const std::int64_t vocab : {37, 1000}) {
    CAPTURE(vocab);
    auto logits = random_input<S>(n * vocab, 81, -10.0f, 10.0f);
    // The log-probabilities are fp32 from the same logits in the same order on both sides.
    DeviceArray<float> logp(static_cast<std::size_t>(n * vocab)),
        want(static_cast<std::size_t>(n * vocab));
    dev::log_softmax_forward(gpu.launch(), logp.get(), logits.half.get(), n, vocab);
    dev::log_softmax_forward(gpu.launch(), want.get(), logits.full.get(), n, vocab);
    gpu.finish();
    check_within(logp.download(), want.download(), 0.0, {}, kSameArithmetic,
                 std::string(kName<S>) + " logp");

    // The backward reads fp32 dlogp and logp and writes dlogits in S (garbage before).
    const DeviceArray<float> dlogp(random_floats(n * vocab, 83));
    auto dlogits = random_input<S>(n * vocab, 84, 100.0f, 1000.0f);
    dev::log_softmax_backward(gpu.launch(), dlogits.half.get(), dlogp.get(), want.get(), n, vocab);
    dev::log_softmax_backward(gpu.launch(), dlogits.full.get(), dlogp.get(), want.get(), n, vocab);
    gpu.finish();
    check_rounded(dlogits.half, dlogits.full, kSameArithmetic, "dlogits");
  }
}

TEST_CASE_TEMPLATE("kernels::cuda 16-bit copy, add, narrow and widen_add", S, bf16, f16) {
  Gpu gpu;
  const std::int64_t n = 1001;
  auto a = random_input<S>(n, 91), b = random_input<S>(n, 92);
  DeviceArray<S> copied(static_cast<std::size_t>(n));
  dev::copy(gpu.launch(), copied.get(), a.half.get(), n);
  dev::add(gpu.launch(), a.half.get(), b.half.get(), n);
  dev::add(gpu.launch(), a.full.get(), b.full.get(), n);
  gpu.finish();
  CHECK(widened(copied.download()) == a.values);  // copied before the add changed a
  check_rounded(a.half, a.full, kSameArithmetic, "add");

  // narrow rounds to nearest as the host's narrow<S> does, bit for bit; widen_add adds exactly
  // the widened values in fp32.
  const Floats master = random_floats(n, 93, -300.0f, 300.0f);
  DeviceArray<float> d_master(master);
  DeviceArray<S> narrow(static_cast<std::size_t>(n));
  dev::narrow(gpu.launch(), narrow.get(), d_master.get(), n);
  dev::widen_add(gpu.launch(), d_master.get(), b.half.get(), n);
  const std::vector<S> got = narrow.download();
  const Floats sum = d_master.download();
  std::size_t wrong_narrow = 0, wrong_sum = 0;
  for (std::size_t i = 0; i < master.size(); ++i) {
    wrong_narrow += got[i].bits != shardplan::kernels::narrow<S>(master[i]).bits ? 1 : 0;
    wrong_sum += sum[i] != master[i] + b.values[i] ? 1 : 0;
  }
  CHECK(wrong_narrow == 0);
  CHECK(wrong_sum == 0);
}

namespace {

// The bounds of the attention checks, on the host in double from the inputs' values and the given
// probabilities P: for every element of probs, out, dq, dk, dv the first-order bound of the 16-bit
// kernels' roundings in units of u (multiplied by u and doubled by the checks).
// Layouts as the kernels: q, dout [B, T, heads, d]; k, v [B, T, kv_heads, d]; P [B, heads, T, T].
//
// Eager attention in S, forward (every GEMM output rounded once, from fp32 sums):
//   s̃ = s(1 + δ), |δ| ≤ u: the rounded scores; softmax from them moves p_tj by
//   p_tj·scale·(Δs_tj − Σ_i p_ti·Δs_ti), at most p_tj·e_tj with
//   e_tj = scale·(|s_tj| + Σ_i p_ti|s_ti|) (units of u); p is then rounded:
//   |Δp_tj| ≤ p_tj·(e_tj + 1).
//   out_t = Σ_j p̃_tj v_j rounded: |Δout_tc| ≤ Σ_j p_tj(e_tj + 1)|v_jc| + |out_tc|.
// Backward, from the rounded probabilities P̃ (both sides read the same ones):
//   dP = dO·vᵀ rounded: |ΔdP_tj| ≤ |dP_tj|; dot_t = Σ_j p_tj dP_tj moves by a_t = Σ_j p_tj|dP_tj|;
//   dS_tj = p_tj(dP_tj − dot_t)·scale rounded: |ΔdS_tj| ≤ p_tj·scale·(|dP_tj| + a_t) + |dS_tj|;
//   dq_t += Σ_j dS_tj k_j, rounded once: Σ_j |ΔdS_tj||k_jc| + |dq0_tc| + Σ_j |dS_tj k_jc|;
//   dk_j += Σ_t dS_tj q_t and dv_j += Σ_t p_tj dO_t, over the G query heads of kv head j's group in
//   G GEMMs, each rounding: Σ |ΔdS_tj||q_tc| + G·(|dk0_jc| + Σ |dS_tj q_tc|), and
//   G·(|dv0_jc| + Σ p_tj|dO_tc|).
// Flash attention in S against eager attention in fp32: scores and probabilities stay fp32; out,
// dq, dk, dv are rounded once each (|want|, which the checks add), and D = rowsum(dO ∘ out) is
// taken from the rounded out: ΔD_t ≤ b_t = Σ_c |dO_tc||out_tc|, which moves dS_tj by
// p_tj·scale·b_t: dq by Σ_j p_tj·scale·b_t|k_jc|, dk by Σ_t p_tj·scale·b_t|q_tc|.
struct AttentionShape {
  std::int64_t batch, seq, heads, kv_heads, head_dim;
};

struct AttentionBounds {
  Doubles probs, out, dq, dk, dv;  // eager attention in S
  Doubles flash_dq, flash_dk;      // flash attention in S (the D term)
};

// Left whole: one pass over each query row feeds every bound from the same per-row sums.
AttentionBounds attention_bounds(const AttentionShape& s, const Floats& q, const Floats& k,
                                 const Floats& v, const Floats& dout, const Floats& probs,
                                 const Floats& out, const Floats& dq0, const Floats& dk0,
                                 const Floats& dv0) {
  const std::int64_t T = s.seq, d = s.head_dim, H = s.heads, G = s.heads / s.kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const auto at = [](const Floats& x, std::int64_t i) {
    return static_cast<double>(x[static_cast<std::size_t>(i)]);
  };
  const auto qi = [&](std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t c) {
    return ((b * T + t) * H + h) * d + c;
  };
  const auto ki = [&](std::int64_t b, std::int64_t t, std::int64_t g, std::int64_t c) {
    return ((b * T + t) * s.kv_heads + g) * d + c;
  };
  AttentionBounds r;
  r.probs.assign(probs.size(), 0.0);
  r.out.assign(q.size(), 0.0);
  r.dq.assign(q.size(), 0.0);
  r.flash_dq.assign(q.size(), 0.0);
  r.dk.assign(k.size(), 0.0);
  r.flash_dk.assign(k.size(), 0.0);
  r.dv.assign(v.size(), 0.0);
  Doubles dk_sum(k.size(), 0.0), dv_sum(v.size(), 0.0);  // Σ |dS q|, Σ p|dO| over the group
  Doubles score(static_cast<std::size_t>(T)), e(static_cast<std::size_t>(T)),
      dp(static_cast<std::size_t>(T)), dds(static_cast<std::size_t>(T)),
      ds(static_cast<std::size_t>(T));
  for (std::int64_t b = 0; b < s.batch; ++b)
    for (std::int64_t h = 0; h < H; ++h) {
      const std::int64_t g = h / G;
      for (std::int64_t t = 0; t < T; ++t) {
        const std::int64_t prow = ((b * H + h) * T + t) * T;
        double mean_abs_score = 0.0, a = 0.0, dot = 0.0, b_t = 0.0;
        for (std::int64_t c = 0; c < d; ++c)
          b_t += std::fabs(at(dout, qi(b, t, h, c)) * at(out, qi(b, t, h, c)));
        for (std::int64_t j = 0; j <= t; ++j) {
          double sum = 0.0, dsum = 0.0;
          for (std::int64_t c = 0; c < d; ++c) {
            sum += at(q, qi(b, t, h, c)) * at(k, ki(b, j, g, c));
            dsum += at(dout, qi(b, t, h, c)) * at(v, ki(b, j, g, c));
          }
          const auto J = static_cast<std::size_t>(j);
          score[J] = sum;
          dp[J] = dsum;
          const double p = at(probs, prow + j);
          mean_abs_score += p * std::fabs(sum);
          a += p * std::fabs(dsum);
          dot += p * dsum;
        }
        for (std::int64_t j = 0; j <= t; ++j) {
          const auto J = static_cast<std::size_t>(j);
          const double p = at(probs, prow + j);
          e[J] = scale * (std::fabs(score[J]) + mean_abs_score);
          r.probs[static_cast<std::size_t>(prow + j)] = p * (e[J] + 1.0);
          ds[J] = p * (dp[J] - dot) * scale;
          dds[J] = p * scale * (std::fabs(dp[J]) + a) + std::fabs(ds[J]);
        }
        for (std::int64_t c = 0; c < d; ++c) {
          const auto o = static_cast<std::size_t>(qi(b, t, h, c));
          double out_bound = std::fabs(at(out, qi(b, t, h, c)));
          double dq_bound = std::fabs(at(dq0, qi(b, t, h, c)));
          double flash = 0.0;
          for (std::int64_t j = 0; j <= t; ++j) {
            const auto J = static_cast<std::size_t>(j);
            const double p = at(probs, prow + j), kj = std::fabs(at(k, ki(b, j, g, c)));
            out_bound += p * (e[J] + 1.0) * std::fabs(at(v, ki(b, j, g, c)));
            dq_bound += dds[J] * kj + std::fabs(ds[J]) * kj;
            flash += p * scale * b_t * kj;
          }
          r.out[o] = out_bound;
          r.dq[o] = dq_bound;
          r.flash_dq[o] = flash;
        }
        // Key j's share of dk, dv from this query row.
        for (std::int64_t j = 0; j <= t; ++j) {
          const auto J = static_cast<std::size_t>(j);
          const double p = at(probs, prow + j);
          for (std::int64_t c = 0; c < d; ++c) {
            const auto kv = static_cast<std::size_t>(ki(b, j, g, c));
            const double qc = std::fabs(at(q, qi(b, t, h, c)));
            r.dk[kv] += dds[J] * qc;
            dk_sum[kv] += std::fabs(ds[J]) * qc;
            dv_sum[kv] += p * std::fabs(at(dout, qi(b, t, h, c)));
            r.flash_dk[kv] += p * scale * b_t * qc;
          }
        }
      }
    }
  for (std::size_t i = 0; i < k.size(); ++i) {
    r.dk[i] += static_cast<double>(G) * (std::fabs(static_cast<double>(dk0[i])) + dk_sum[i]);
    r.dv[i] = static_cast<double>(G) * (std::fabs(static_cast<double>(dv0[i])) + dv_sum[i]);
  }
  return r;
}

// The checks' factor on the first-order bounds above: twice them, in units of u.
template <class S> constexpr double kAttention = 2 * kUnitRoundoff<S>;

// |got − want| ≤ c_u·bound + floor·max|want| (the bound in place of |want| + m).
void check_bound(const Floats& got, const Floats& want, double c_u, const Doubles& bound,
                 double floor, const std::string& what) {
  Doubles zero_want_share(bound);
  for (std::size_t i = 0; i < bound.size(); ++i)
    zero_want_share[i] -= std::fabs(static_cast<double>(want[i]));  // check_within adds |want|
  check_within(got, want, c_u, zero_want_share, floor, what);
}

}  // namespace

TEST_CASE_TEMPLATE("kernels::cuda 16-bit eager attention is the fp32 one within its roundings", S,
                   bf16, f16) {
  Gpu gpu;
  // Grouped (2 query heads per kv head), multi-query, a sequence longer than a warp, head_dim 16.
  for (const AttentionShape s : {AttentionShape{2, 7, 4, 2, 8}, AttentionShape{2, 7, 4, 1, 8},
                                 AttentionShape{1, 37, 6, 2, 16}}) {
    CAPTURE(s.seq);
    CAPTURE(s.kv_heads);
    CAPTURE(s.head_dim);
    const std::int64_t n = s.batch * s.seq, qw = s.heads * s.head_dim, kw = s.kv_heads * s.head_dim;
    const std::int64_t scores = s.batch * s.heads * s.seq * s.seq;
    auto q = random_input<S>(n * qw, 61), k = random_input<S>(n * kw, 62),
         v = random_input<S>(n * kw, 63), dout = random_input<S>(n * qw, 64);
    DeviceArray<S> out(static_cast<std::size_t>(n * qw)), probs(static_cast<std::size_t>(scores));
    DeviceArray<float> out_full(static_cast<std::size_t>(n * qw)),
        probs_full(static_cast<std::size_t>(scores));
    dev::attention_forward(gpu.launch(), out.get(), probs.get(), q.half.get(), k.half.get(),
                           v.half.get(), s.batch, s.seq, s.heads, s.kv_heads, s.head_dim);
    dev::attention_forward(gpu.launch(), out_full.get(), probs_full.get(), q.full.get(),
                           k.full.get(), v.full.get(), s.batch, s.seq, s.heads, s.kv_heads,
                           s.head_dim);
    gpu.finish();
    const Floats want_probs = probs_full.download(), want_out = out_full.download();

    // The backward reads the fp32 probabilities rounded to S, on both sides.
    Input<S> p(want_probs);
    auto dq = random_input<S>(n * qw, 68), dk = random_input<S>(n * kw, 69),
         dv = random_input<S>(n * kw, 70);
    const AttentionBounds bound =
        attention_bounds(s, q.values, k.values, v.values, dout.values, p.values, want_out,
                         dq.values, dk.values, dv.values);
    // The forward's bounds from the fp32 probabilities (not those rounded).
    const AttentionBounds forward =
        attention_bounds(s, q.values, k.values, v.values, dout.values, want_probs, want_out,
                         dq.values, dk.values, dv.values);
    check_bound(widened(probs.download()), want_probs, kAttention<S>, forward.probs, kReordered,
                std::string(kName<S>) + " probs");
    check_bound(widened(out.download()), want_out, kAttention<S>, forward.out, kReordered,
                std::string(kName<S>) + " out");

    DeviceArray<S> scratch(static_cast<std::size_t>(scores));
    DeviceArray<float> scratch_full(static_cast<std::size_t>(scores));
    dev::attention_backward(gpu.launch(), dq.half.get(), dk.half.get(), dv.half.get(),
                            scratch.get(), dout.half.get(), p.half.get(), q.half.get(),
                            k.half.get(), v.half.get(), s.batch, s.seq, s.heads, s.kv_heads,
                            s.head_dim);
    dev::attention_backward(gpu.launch(), dq.full.get(), dk.full.get(), dv.full.get(),
                            scratch_full.get(), dout.full.get(), p.full.get(), q.full.get(),
                            k.full.get(), v.full.get(), s.batch, s.seq, s.heads, s.kv_heads,
                            s.head_dim);
    gpu.finish();
    check_bound(widened(dq.half.download()), dq.full.download(), kAttention<S>, bound.dq,
                kReordered, std::string(kName<S>) + " dq");
    check_bound(widened(dk.half.download()), dk.full.download(), kAttention<S>, bound.dk,
                kReordered, std::string(kName<S>) + " dk");
    check_bound(widened(dv.half.download()), dv.full.download(), kAttention<S>, bound.dv,
                kReordered, std::string(kName<S>) + " dv");
  }
}

TEST_CASE_TEMPLATE("kernels::cuda 16-bit flash attention is eager fp32 attention rounded", S, bf16,
                   f16) {
  Gpu gpu;
  // The head dims built in 16 bits; T = 37 (a partial last tile), groups of 2, 1 and 3, several
  // tiles at T = 130.
  for (const AttentionShape s : {AttentionShape{2, 37, 4, 2, 64}, AttentionShape{2, 37, 4, 2, 128},
                                 AttentionShape{2, 37, 4, 4, 64}, AttentionShape{1, 130, 6, 2, 64},
                                 AttentionShape{1, 130, 3, 1, 128}}) {
    CAPTURE(s.seq);
    CAPTURE(s.heads);
    CAPTURE(s.kv_heads);
    CAPTURE(s.head_dim);
    REQUIRE(dev::flash_attention_supports<S>(s.head_dim));
    const std::int64_t n = s.batch * s.seq, qw = s.heads * s.head_dim, kw = s.kv_heads * s.head_dim;
    const std::int64_t scores = s.batch * s.heads * s.seq * s.seq;
    const std::int64_t stats = s.batch * s.heads * s.seq;
    // q, k in [−2, 2]: peaked softmax rows, as test_flash_attention.cpp.
    auto q = random_input<S>(n * qw, 161, -2.0f, 2.0f),
         k = random_input<S>(n * kw, 162, -2.0f, 2.0f), v = random_input<S>(n * kw, 163),
         dout = random_input<S>(n * qw, 164);
    DeviceArray<S> out(static_cast<std::size_t>(n * qw));
    DeviceArray<float> lse(static_cast<std::size_t>(stats)), delta(static_cast<std::size_t>(stats));
    DeviceArray<float> out_full(static_cast<std::size_t>(n * qw)),
        probs_full(static_cast<std::size_t>(scores)),
        scratch_full(static_cast<std::size_t>(scores)), lse_full(static_cast<std::size_t>(stats)),
        out_flash_full(static_cast<std::size_t>(n * qw));
    dev::flash_attention_forward(gpu.stream(), out.get(), lse.get(), q.half.get(), k.half.get(),
                                 v.half.get(), s.batch, s.seq, s.heads, s.kv_heads, s.head_dim);
    dev::attention_forward(gpu.launch(), out_full.get(), probs_full.get(), q.full.get(),
                           k.full.get(), v.full.get(), s.batch, s.seq, s.heads, s.kv_heads,
                           s.head_dim);
    // lse against fp32 flash attention's: the same fp32 arithmetic on the same values.
    dev::flash_attention_forward(gpu.stream(), out_flash_full.get(), lse_full.get(), q.full.get(),
                                 k.full.get(), v.full.get(), s.batch, s.seq, s.heads, s.kv_heads,
                                 s.head_dim);
    gpu.finish();
    const Floats want_out = out_full.download(), want_probs = probs_full.download();
    check_within(widened(out.download()), want_out, kUnitRoundoff<S>, {}, kReordered,
                 std::string(kName<S>) + " out");
    check_within(lse.download(), lse_full.download(), 0.0, {}, kSameArithmetic,
                 std::string(kName<S>) + " lse");

    auto dq = random_input<S>(n * qw, 168), dk = random_input<S>(n * kw, 169),
         dv = random_input<S>(n * kw, 170);
    const AttentionBounds bound =
        attention_bounds(s, q.values, k.values, v.values, dout.values, want_probs, want_out,
                         dq.values, dk.values, dv.values);
    dev::flash_attention_backward(gpu.stream(), dq.half.get(), dk.half.get(), dv.half.get(),
                                  delta.get(), dout.half.get(), out.get(), lse.get(), q.half.get(),
                                  k.half.get(), v.half.get(), s.batch, s.seq, s.heads, s.kv_heads,
                                  s.head_dim);
    dev::attention_backward(gpu.launch(), dq.full.get(), dk.full.get(), dv.full.get(),
                            scratch_full.get(), dout.full.get(), probs_full.get(), q.full.get(),
                            k.full.get(), v.full.get(), s.batch, s.seq, s.heads, s.kv_heads,
                            s.head_dim);
    gpu.finish();
    // One rounding each (|want|), and for dq and dk the D term: 2·(|want| + term) in units of u.
    check_within(widened(dq.half.download()), dq.full.download(), 2 * kUnitRoundoff<S>,
                 bound.flash_dq, kReordered, std::string(kName<S>) + " dq");
    check_within(widened(dk.half.download()), dk.full.download(), 2 * kUnitRoundoff<S>,
                 bound.flash_dk, kReordered, std::string(kName<S>) + " dk");
    check_within(widened(dv.half.download()), dv.full.download(), 2 * kUnitRoundoff<S>, {},
                 kReordered, std::string(kName<S>) + " dv");
  }
}

TEST_CASE_TEMPLATE("kernels::cuda 16-bit flash attention takes head dims 64 and 128", S, bf16,
                   f16) {
  CHECK(dev::flash_attention_supports<S>(64));
  CHECK(dev::flash_attention_supports<S>(128));
  CHECK_FALSE(dev::flash_attention_supports<S>(16));
  CHECK_FALSE(dev::flash_attention_supports<S>(256));
  CHECK(dev::flash_attention_supports<float>(16));
  DeviceArray<S> x(4096);
  DeviceArray<float> stats(64);
  S* p = x.get();
  CHECK_THROWS_WITH_AS(
      dev::flash_attention_forward(nullptr, p, stats.get(), p, p, p, 1, 4, 2, 1, 16),
      doctest::Contains("head_dim 16 is not supported in 16 bits (64 or 128)"), std::runtime_error);
  CHECK_NOTHROW(dev::flash_attention_backward(nullptr, p, p, p, stats.get(), p, p, stats.get(), p,
                                              p, p, 0, 4, 2, 1, 64));
  require_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

TEST_CASE_TEMPLATE("kernels::cuda 16-bit kernels queue nothing for empty inputs", S, bf16, f16) {
  Gpu gpu;
  const auto& l = gpu.launch();
  S* none = nullptr;
  float* no_stats = nullptr;
  const std::int32_t* no_tokens = nullptr;
  CHECK_NOTHROW(dev::embedding_forward(l, none, no_tokens, none, none, 0, 7, 33));
  CHECK_NOTHROW(dev::embedding_backward(l, none, none, none, no_tokens, 2, 0, 33));
  CHECK_NOTHROW(dev::linear_forward(l, none, none, none, none, 0, 33, 37, false));
  CHECK_NOTHROW(dev::linear_backward(l, none, none, none, none, none, none, 14, 33, 0));
  CHECK_NOTHROW(
      dev::layernorm_forward(l, none, no_stats, no_stats, none, none, none, 0, 33, 1e-5f));
  CHECK_NOTHROW(
      dev::layernorm_backward(l, none, none, none, none, none, none, no_stats, no_stats, 0, 33));
  CHECK_NOTHROW(dev::rmsnorm_forward(l, none, no_stats, none, none, 14, 0, 1e-5f));
  CHECK_NOTHROW(dev::rmsnorm_backward(l, none, none, none, none, none, no_stats, 0, 33));
  CHECK_NOTHROW(dev::rope_forward(l, none, 0, 7, 4, 8, 1e4));
  CHECK_NOTHROW(dev::attention_forward(l, none, none, none, none, none, 2, 0, 4, 2, 8));
  CHECK_NOTHROW(dev::attention_backward(l, none, none, none, none, none, none, none, none, none, 0,
                                        7, 4, 2, 8));
  CHECK_NOTHROW(dev::gelu_forward(l, none, none, 0));
  CHECK_NOTHROW(dev::swiglu_backward(l, none, none, none, none, none, 0));
  CHECK_NOTHROW(dev::log_softmax_forward(l, no_stats, none, 0, 37));
  CHECK_NOTHROW(dev::log_softmax_backward(l, none, no_stats, no_stats, 14, 0));
  CHECK_NOTHROW(dev::copy(l, none, none, 0));
  CHECK_NOTHROW(dev::add(l, none, none, 0));
  CHECK_NOTHROW(dev::narrow(l, none, no_stats, 0));
  CHECK_NOTHROW(dev::widen_add(l, no_stats, none, 0));
  CHECK_NOTHROW(gpu.finish());
}
