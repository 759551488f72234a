// The GPU backend's layer kernels (kernels/cuda/device_kernels.hpp) against the host kernels
// (kernels/kernels.hpp) and AdamW (kernels/adamw.hpp), which are the reference: the same random
// inputs on both, odd sizes (14 rows, 33 channels, vocabulary 37, 7 positions, grouped heads), and
// every backward kernel called twice from nonzero gradients, since it must ADD each time.
//
// Tolerances, relative to the largest element of the expected array (check_close): fp32's unit
// roundoff is u = 2⁻²⁴ ≈ 6e-8, and a sum of k terms taken in another order (warp shuffles, cuBLAS's
// blocking) differs by at most about k·u·Σ|terms|; with terms of O(1) and k ≤ 300 that is ≤ 2e-5 of
// the sums' scale. An index or accumulation error moves an element by O(1) of that scale.
//
// Skipped without a CUDA device (gpu_test_main.cpp).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "gpu_fixture.hpp"
#include "kernels/adamw.hpp"
#include "kernels/cuda/device_kernels.hpp"
#include "kernels/kernels.hpp"

namespace {

namespace dev = shardplan::kernels::cuda;
namespace host = shardplan::kernels;
using namespace shardplan::executor::testing;

// Relative tolerances (see the top of the file).
constexpr double kElementwise = 1e-5;  // a few roundings; tanhf, expf within 2 ulp of libm's
constexpr double kReduction = 2e-4;    // sums of up to 300 terms in another order
constexpr double kExact = 1e-7;        // the same single rounding on both sides

// Every element within tol·(|want| + max |want|); reports how many are not, and the first.
void check_close(const Floats& got, const Floats& want, double tol, const std::string& what) {
  check_elements(got, want, what, [tol](double got_i, double want_i, std::size_t, double scale) {
    const double error = std::fabs(got_i - want_i);
    return error <= tol * (std::fabs(want_i) + scale);
  });
}

std::string after_call(const char* name, int call) {
  return std::string(name) + " after call " + std::to_string(call);
}

}  // namespace

TEST_CASE("kernels::cuda embedding forward and backward match the host's") {
  Gpu gpu;
  const std::int64_t B = 2, T = 7, C = 33, V = 37, P = T + 3, N = B * T;
  // Five distinct tokens in 14 places: rows of dwte receive several tokens' gradients at once.
  const Tokens tokens = random_tokens(N, 5, 1);
  const Floats wte = random_floats(V * C, 2), wpe = random_floats(P * C, 3);
  DeviceArray<std::int32_t> d_tokens(tokens);
  DeviceArray<float> d_wte(wte), d_wpe(wpe);
  for (const bool positions : {true, false}) {
    CAPTURE(positions);
    Floats want(static_cast<std::size_t>(N * C));
    host::embedding_forward(want.data(), tokens.data(), wte.data(),
                            positions ? wpe.data() : nullptr, B, T, C);
    DeviceArray<float> out(random_floats(N * C, 4));
    dev::embedding_forward(gpu.launch(), out.get(), d_tokens.get(), d_wte.get(),
                           positions ? d_wpe.get() : nullptr, B, T, C);
    gpu.finish();
    check_close(out.download(), want, kElementwise, "out");

    const Floats dout = random_floats(N * C, 5);
    Floats dwte = random_floats(V * C, 6), dwpe = random_floats(P * C, 7);
    DeviceArray<float> d_dout(dout), d_dwte(dwte), d_dwpe(dwpe);
    for (int call = 1; call <= 2; ++call) {
      host::embedding_backward(dwte.data(), positions ? dwpe.data() : nullptr, dout.data(),
                               tokens.data(), B, T, C);
      dev::embedding_backward(gpu.launch(), d_dwte.get(), positions ? d_dwpe.get() : nullptr,
                              d_dout.get(), d_tokens.get(), B, T, C);
      gpu.finish();
      check_close(d_dwte.download(), dwte, kElementwise, after_call("dwte", call));
      check_close(d_dwpe.download(), dwpe, kElementwise, after_call("dwpe", call));
    }
  }
}

TEST_CASE("kernels::cuda linear forward matches the host's") {
  Gpu gpu;
  const std::int64_t n = 14, in = 33, out = 37;
  const Floats x = random_floats(n * in, 11), w = random_floats(out * in, 12),
               b = random_floats(out, 13), y0 = random_floats(n * out, 14);
  DeviceArray<float> d_x(x), d_w(w), d_b(b);
  for (const bool accumulate : {false, true})
    for (const bool bias : {false, true}) {
      CAPTURE(accumulate);
      CAPTURE(bias);
      Floats want = y0;
      host::linear_forward(want.data(), x.data(), w.data(), bias ? b.data() : nullptr, n, in, out,
                           accumulate);
      DeviceArray<float> y(y0);  // not accumulating: y0 must be overwritten
      dev::linear_forward(gpu.launch(), y.get(), d_x.get(), d_w.get(), bias ? d_b.get() : nullptr,
                          n, in, out, accumulate);
      gpu.finish();
      check_close(y.download(), want, kReduction, "y");
    }
}

TEST_CASE("kernels::cuda linear backward adds the host's gradients") {
  Gpu gpu;
  struct Shape {
    std::int64_t n, in, out;
  };
  // The second shape splits the bias gradient's 300 rows into chunks (column_sums_kernel).
  for (const Shape s : {Shape{14, 33, 37}, Shape{300, 70, 45}}) {
    CAPTURE(s.n);
    const Floats dy = random_floats(s.n * s.out, 21), x = random_floats(s.n * s.in, 22),
                 w = random_floats(s.out * s.in, 23);
    DeviceArray<float> d_dy(dy), d_x(x), d_w(w);
    for (const bool with_dx : {true, false})
      for (const bool with_db : {true, false}) {
        CAPTURE(with_dx);
        CAPTURE(with_db);
        Floats dx = random_floats(s.n * s.in, 24), dw = random_floats(s.out * s.in, 25),
               db = random_floats(s.out, 26);
        DeviceArray<float> d_dx(dx), d_dw(dw), d_db(db);
        for (int call = 1; call <= 2; ++call) {
          host::linear_backward(with_dx ? dx.data() : nullptr, dw.data(),
                                with_db ? db.data() : nullptr, dy.data(), x.data(), w.data(), s.n,
                                s.in, s.out);
          dev::linear_backward(gpu.launch(), with_dx ? d_dx.get() : nullptr, d_dw.get(),
                               with_db ? d_db.get() : nullptr, d_dy.get(), d_x.get(), d_w.get(),
                               s.n, s.in, s.out);
          gpu.finish();
          check_close(d_dx.download(), dx, kReduction, after_call("dx", call));
          check_close(d_dw.download(), dw, kReduction, after_call("dw", call));
          check_close(d_db.download(), db, kReduction, after_call("db", call));
        }
      }
  }
}

// TF32 rounds each GEMM input to 10 explicit mantissa bits, a relative error of at most 2⁻¹⁰
// (truncation; 2⁻¹¹ rounding to nearest); a product of two rounded inputs is off by at most
// (2·2⁻¹⁰ + 2⁻²⁰)·|x·w|, and the fp32 accumulation of k = 64 of them adds ≤ 64·2⁻²⁴·Σ|x·w|. So
// |y − y_fp32| ≤ 2.0e-3·Σₖ|x||w|, which the host's GEMM of |x| and |w| gives.
TEST_CASE("kernels::cuda linear forward under TF32 is within TF32's rounding of the host's") {
  Gpu gpu;
  const std::int64_t n = 14, in = 64, out = 37;
  const Floats x = random_floats(n * in, 31), w = random_floats(out * in, 32),
               b = random_floats(out, 33);
  Floats want(static_cast<std::size_t>(n * out)), magnitude(want.size());
  host::linear_forward(want.data(), x.data(), w.data(), b.data(), n, in, out, false);
  Floats abs_x = x, abs_w = w;
  for (auto& v : abs_x) v = std::fabs(v);
  for (auto& v : abs_w) v = std::fabs(v);
  host::linear_forward(magnitude.data(), abs_x.data(), abs_w.data(),
                       static_cast<const float*>(nullptr), n, in, out, false);

  dev::set_tf32(gpu.blas(), true);
  cublasMath_t mode{};
  REQUIRE(cublasGetMathMode(gpu.blas(), &mode) == CUBLAS_STATUS_SUCCESS);
  CHECK(mode == CUBLAS_TF32_TENSOR_OP_MATH);
  DeviceArray<float> d_x(x), d_w(w), d_b(b), y(want.size());
  dev::linear_forward(gpu.launch(), y.get(), d_x.get(), d_w.get(), d_b.get(), n, in, out, false);
  gpu.finish();
  const Floats got = y.download();
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double bound = 2.0e-3 * static_cast<double>(magnitude[i]) +
                         1e-6 * (1.0 + std::fabs(static_cast<double>(want[i])));  // bias add
    if (!(std::fabs(static_cast<double>(got[i]) - static_cast<double>(want[i])) <= bound)) ++wrong;
  }
  CHECK(wrong == 0);

  dev::set_tf32(gpu.blas(), false);
  REQUIRE(cublasGetMathMode(gpu.blas(), &mode) == CUBLAS_STATUS_SUCCESS);
  CHECK(mode == CUBLAS_DEFAULT_MATH);
}

TEST_CASE("kernels::cuda layernorm and rmsnorm match the host's") {
  Gpu gpu;
  struct Shape {
    std::int64_t n, channels;
  };
  const float eps = 1e-5f;
  // 33 channels: lanes 0 and 32 of a row's warp; 300 × 70: three columns of 32 and ten row chunks
  // in the weight gradients.
  for (const Shape s : {Shape{14, 33}, Shape{300, 70}}) {
    CAPTURE(s.n);
    const std::int64_t n = s.n, c = s.channels;
    const Floats x = random_floats(n * c, 41, -2.0f, 3.0f), w = random_floats(c, 42),
                 b = random_floats(c, 43), dy = random_floats(n * c, 44);
    DeviceArray<float> d_x(x), d_w(w), d_b(b), d_dy(dy);

    // LayerNorm
    Floats y(static_cast<std::size_t>(n * c)), mean(static_cast<std::size_t>(n)), rstd(mean.size());
    host::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), n, c,
                            eps);
    DeviceArray<float> d_y(y.size()), d_mean(mean.size()), d_rstd(rstd.size());
    dev::layernorm_forward(gpu.launch(), d_y.get(), d_mean.get(), d_rstd.get(), d_x.get(),
                           d_w.get(), d_b.get(), n, c, eps);
    gpu.finish();
    check_close(d_y.download(), y, kReduction, "layernorm y");
    check_close(d_mean.download(), mean, kReduction, "layernorm mean");
    check_close(d_rstd.download(), rstd, kReduction, "layernorm rstd");
    {
      d_mean.upload(mean);  // the backward reads the host's statistics
      d_rstd.upload(rstd);
      Floats dx = random_floats(n * c, 45), dw = random_floats(c, 46), db = random_floats(c, 47);
      DeviceArray<float> d_dx(dx), d_dw(dw), d_db(db);
      for (int call = 1; call <= 2; ++call) {
        host::layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(),
                                 mean.data(), rstd.data(), n, c);
        dev::layernorm_backward(gpu.launch(), d_dx.get(), d_dw.get(), d_db.get(), d_dy.get(),
                                d_x.get(), d_w.get(), d_mean.get(), d_rstd.get(), n, c);
        gpu.finish();
        check_close(d_dx.download(), dx, kReduction, after_call("layernorm dx", call));
        check_close(d_dw.download(), dw, kReduction, after_call("layernorm dw", call));
        check_close(d_db.download(), db, kReduction, after_call("layernorm db", call));
      }
    }

    // RMSNorm
    host::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), n, c, eps);
    dev::rmsnorm_forward(gpu.launch(), d_y.get(), d_rstd.get(), d_x.get(), d_w.get(), n, c, eps);
    gpu.finish();
    check_close(d_y.download(), y, kReduction, "rmsnorm y");
    check_close(d_rstd.download(), rstd, kReduction, "rmsnorm rstd");
    {
      d_rstd.upload(rstd);
      Floats dx = random_floats(n * c, 48), dw = random_floats(c, 49);
      DeviceArray<float> d_dx(dx), d_dw(dw);
      for (int call = 1; call <= 2; ++call) {
        host::rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), n,
                               c);
        dev::rmsnorm_backward(gpu.launch(), d_dx.get(), d_dw.get(), d_dy.get(), d_x.get(),
                              d_w.get(), d_rstd.get(), n, c);
        gpu.finish();
        check_close(d_dx.download(), dx, kReduction, after_call("rmsnorm dx", call));
        check_close(d_dw.download(), dw, kReduction, after_call("rmsnorm dw", call));
      }
    }
  }
}

TEST_CASE("kernels::cuda rotary positions match the host's") {
  Gpu gpu;
  struct Shape {
    std::int64_t batch, seq, heads, head_dim;
  };
  // Query heads and kv heads; a long sequence (angles up to 999 rad, where float angles would
  // drift); head_dim 6 (three pairs) and 7 (the last channel is left alone, as on the host).
  for (const Shape s : {Shape{2, 7, 4, 8}, Shape{2, 7, 2, 8}, Shape{1, 1000, 2, 8},
                        Shape{2, 7, 3, 6}, Shape{2, 5, 2, 7}}) {
    CAPTURE(s.seq);
    CAPTURE(s.heads);
    CAPTURE(s.head_dim);
    const double theta = 10000.0;
    const Floats x = random_floats(s.batch * s.seq * s.heads * s.head_dim, 51);
    Floats forward = x, backward = x;
    host::rope_forward(forward.data(), s.batch, s.seq, s.heads, s.head_dim, theta);
    host::rope_backward(backward.data(), s.batch, s.seq, s.heads, s.head_dim, theta);
    DeviceArray<float> d_forward(x), d_backward(x);
    dev::rope_forward(gpu.launch(), d_forward.get(), s.batch, s.seq, s.heads, s.head_dim, theta);
    dev::rope_backward(gpu.launch(), d_backward.get(), s.batch, s.seq, s.heads, s.head_dim, theta);
    gpu.finish();
    check_close(d_forward.download(), forward, kElementwise, "rope forward");
    check_close(d_backward.download(), backward, kElementwise, "rope backward");
  }
}

TEST_CASE("kernels::cuda attention forward and backward match the host's") {
  Gpu gpu;
  struct Shape {
    std::int64_t batch, seq, heads, kv_heads, head_dim;
  };
  // Grouped (2 query heads per kv head), multi-head, multi-query; a sequence longer than a warp;
  // an odd head_dim.
  for (const Shape s : {Shape{2, 7, 4, 2, 8}, Shape{2, 7, 4, 4, 8}, Shape{2, 7, 4, 1, 8},
                        Shape{1, 37, 6, 2, 16}, Shape{2, 9, 2, 1, 5}}) {
    CAPTURE(s.seq);
    CAPTURE(s.heads);
    CAPTURE(s.kv_heads);
    CAPTURE(s.head_dim);
    const std::int64_t n = s.batch * s.seq, qw = s.heads * s.head_dim, kw = s.kv_heads * s.head_dim;
    const std::int64_t scores = s.batch * s.heads * s.seq * s.seq;
    const Floats q = random_floats(n * qw, 61), k = random_floats(n * kw, 62),
                 v = random_floats(n * kw, 63), dout = random_floats(n * qw, 64);
    Floats out(static_cast<std::size_t>(n * qw)), probs(static_cast<std::size_t>(scores));
    host::attention_forward(out.data(), probs.data(), q.data(), k.data(), v.data(), s.batch, s.seq,
                            s.heads, s.kv_heads, s.head_dim);
    DeviceArray<float> d_q(q), d_k(k), d_v(v), d_dout(dout);
    // Garbage in the outputs: the forward writes every element, zeros above the diagonal included.
    DeviceArray<float> d_out(random_floats(n * qw, 65)), d_probs(random_floats(scores, 66));
    dev::attention_forward(gpu.launch(), d_out.get(), d_probs.get(), d_q.get(), d_k.get(),
                           d_v.get(), s.batch, s.seq, s.heads, s.kv_heads, s.head_dim);
    gpu.finish();
    check_close(d_probs.download(), probs, kReduction, "probs");
    check_close(d_out.download(), out, kReduction, "out");

    d_probs.upload(probs);  // the backward reads the host's probabilities
    REQUIRE(dev::attention_scratch_elements(s.batch, s.seq, s.heads) == scores);
    DeviceArray<float> d_scratch(random_floats(scores, 67));
    Floats host_scratch(static_cast<std::size_t>(s.seq * s.seq));
    Floats dq = random_floats(n * qw, 68), dk = random_floats(n * kw, 69),
           dv = random_floats(n * kw, 70);
    DeviceArray<float> d_dq(dq), d_dk(dk), d_dv(dv);
    for (int call = 1; call <= 2; ++call) {
      host::attention_backward(dq.data(), dk.data(), dv.data(), host_scratch.data(), dout.data(),
                               probs.data(), q.data(), k.data(), v.data(), s.batch, s.seq, s.heads,
                               s.kv_heads, s.head_dim);
      dev::attention_backward(gpu.launch(), d_dq.get(), d_dk.get(), d_dv.get(), d_scratch.get(),
                              d_dout.get(), d_probs.get(), d_q.get(), d_k.get(), d_v.get(), s.batch,
                              s.seq, s.heads, s.kv_heads, s.head_dim);
      gpu.finish();
      check_close(d_dq.download(), dq, kReduction, after_call("dq", call));
      check_close(d_dk.download(), dk, kReduction, after_call("dk", call));
      check_close(d_dv.download(), dv, kReduction, after_call("dv", call));
    }
  }
}

TEST_CASE("kernels::cuda gelu and swiglu match the host's") {
  Gpu gpu;
  const std::int64_t n = 1001;
  const Floats a = random_floats(n, 71, -5.0f, 5.0f), b = random_floats(n, 72, -5.0f, 5.0f),
               dout = random_floats(n, 73);
  DeviceArray<float> d_a(a), d_b(b), d_dout(dout);
  Floats want(static_cast<std::size_t>(n));
  DeviceArray<float> out(want.size());

  host::gelu_forward(want.data(), a.data(), n);
  dev::gelu_forward(gpu.launch(), out.get(), d_a.get(), n);
  gpu.finish();
  check_close(out.download(), want, kElementwise, "gelu");
  {
    Floats din = random_floats(n, 74);
    DeviceArray<float> d_din(din);
    for (int call = 1; call <= 2; ++call) {
      host::gelu_backward(din.data(), a.data(), dout.data(), n);
      dev::gelu_backward(gpu.launch(), d_din.get(), d_a.get(), d_dout.get(), n);
      gpu.finish();
      check_close(d_din.download(), din, kElementwise, after_call("gelu din", call));
    }
  }

  host::swiglu_forward(want.data(), a.data(), b.data(), n);
  dev::swiglu_forward(gpu.launch(), out.get(), d_a.get(), d_b.get(), n);
  gpu.finish();
  check_close(out.download(), want, kElementwise, "swiglu");
  {
    Floats dgate = random_floats(n, 75), dup = random_floats(n, 76);
    DeviceArray<float> d_dgate(dgate), d_dup(dup);
    for (int call = 1; call <= 2; ++call) {
      host::swiglu_backward(dgate.data(), dup.data(), dout.data(), a.data(), b.data(), n);
      dev::swiglu_backward(gpu.launch(), d_dgate.get(), d_dup.get(), d_dout.get(), d_a.get(),
                           d_b.get(), n);
      gpu.finish();
      check_close(d_dgate.download(), dgate, kElementwise, after_call("swiglu dgate", call));
      check_close(d_dup.download(), dup, kElementwise, after_call("swiglu dup", call));
    }
  }
}

TEST_CASE("kernels::cuda log_softmax and nll_loss match the host's") {
  Gpu gpu;
  const std::int64_t n = 14;
  // 37: fewer entries than a block's threads; 1000: four per thread, not a multiple of 32.
  for (const std::int64_t vocab : {37, 1000}) {
    CAPTURE(vocab);
    const Floats logits = random_floats(n * vocab, 81, -10.0f, 10.0f);
    const Tokens targets = random_tokens(n, static_cast<std::int32_t>(vocab), 82);
    Floats logp(logits.size());
    host::log_softmax_forward(logp.data(), logits.data(), n, vocab);
    DeviceArray<float> d_logits(logits), d_logp(logp.size());
    DeviceArray<std::int32_t> d_targets(targets);
    dev::log_softmax_forward(gpu.launch(), d_logp.get(), d_logits.get(), n, vocab);
    gpu.finish();
    check_close(d_logp.download(), logp, kReduction, "logp");
    d_logp.upload(logp);  // the rest reads the host's log-probabilities

    // The loss ADDS into a device double: from 1.5, two calls give 1.5 + 2·Σ. The host sums in
    // double too, in another order: the difference is far below 1e-12 of Σ|logp|.
    const double sum = host::nll_loss_forward<float>(logp.data(), targets.data(), n, vocab);
    DeviceArray<double> d_loss(std::vector<double>{1.5});
    for (int call = 1; call <= 2; ++call) {
      dev::nll_loss_forward(gpu.launch(), d_loss.get(), d_logp.get(), d_targets.get(), n, vocab);
      gpu.finish();
      const double want = 1.5 + call * sum;
      CHECK(d_loss.download()[0] == doctest::Approx(want).epsilon(1e-12));
    }

    const float scale = 1.0f / static_cast<float>(n);
    Floats dlogp = random_floats(n * vocab, 83);
    DeviceArray<float> d_dlogp(dlogp);
    for (int call = 1; call <= 2; ++call) {
      host::nll_loss_backward<float>(dlogp.data(), targets.data(), n, vocab, scale);
      dev::nll_loss_backward(gpu.launch(), d_dlogp.get(), d_targets.get(), n, vocab, scale);
      gpu.finish();
      check_close(d_dlogp.download(), dlogp, kExact, after_call("dlogp", call));
    }

    // log_softmax_backward WRITES: garbage in dlogits must not survive.
    Floats dlogits(dlogp.size());
    host::log_softmax_backward(dlogits.data(), dlogp.data(), logp.data(), n, vocab);
    DeviceArray<float> d_dlogits(random_floats(n * vocab, 84, 100.0f, 1000.0f));
    dev::log_softmax_backward(gpu.launch(), d_dlogits.get(), d_dlogp.get(), d_logp.get(), n, vocab);
    gpu.finish();
    check_close(d_dlogits.download(), dlogits, kReduction, "dlogits");
  }
}

TEST_CASE("kernels::cuda copy, add and scale") {
  Gpu gpu;
  const std::int64_t n = 1001;
  const Floats a = random_floats(n, 91), b = random_floats(n, 92);
  const float factor = -0.37f;
  Floats sum(a.size()), scaled(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    sum[i] = a[i] + b[i];
    scaled[i] = a[i] * factor;
  }
  DeviceArray<float> d_a(a), d_b(b), d_copy(random_floats(n, 93)), d_scaled(a);
  dev::copy(gpu.launch(), d_copy.get(), d_a.get(), n);
  dev::add(gpu.launch(), d_a.get(), d_b.get(), n);
  dev::scale(gpu.launch(), d_scaled.get(), factor, n);
  gpu.finish();
  CHECK(d_copy.download() == a);  // copied before the add changed a
  CHECK(d_a.download() == sum);
  CHECK(d_scaled.download() == scaled);
}

TEST_CASE("kernels::cuda adamw takes the host's steps") {
  Gpu gpu;
  const std::int64_t n = 1001;
  const shardplan::kernels::AdamWOptions o{
      .lr = 1e-2, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1};
  Floats params = random_floats(n, 101), exp_avg = random_floats(n, 102, -0.1f, 0.1f),
         exp_avg_sq = random_floats(n, 103, 0.0f, 0.01f);
  DeviceArray<float> d_params(params), d_exp_avg(exp_avg), d_exp_avg_sq(exp_avg_sq);
  for (std::int64_t step = 1; step <= 3; ++step) {
    CAPTURE(step);
    const Floats grads = random_floats(n, 104 + static_cast<unsigned>(step));
    shardplan::kernels::adamw_step<float>(params, grads, exp_avg, exp_avg_sq, step, o);
    DeviceArray<float> d_grads(grads);
    dev::adamw_step(gpu.launch(), d_params.get(), d_grads.get(), d_exp_avg.get(),
                    d_exp_avg_sq.get(), n, step, o.lr, o.beta1, o.beta2, o.eps, o.weight_decay);
    gpu.finish();
    // The same operations, rounded the same way but for nvcc's fused multiply-adds: each result
    // is within a few ulps of its terms, and the moving averages' terms (beta·m and (1-beta)·g)
    // can cancel, so the bound is relative to the array's largest value as well as to the
    // element's own: 1e-6 of either leaves room for that while a wrong update (of relative size
    // lr = 1e-2) is far outside.
    const auto each = [](const Floats& got, const Floats& want, const std::string& what) {
      double largest = 0;
      for (const float w : want) largest = std::max(largest, std::fabs(static_cast<double>(w)));
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < got.size(); ++i)
        if (!(std::fabs(static_cast<double>(got[i]) - static_cast<double>(want[i])) <=
              1e-6 * (std::fabs(static_cast<double>(want[i])) + largest)))
          ++wrong;
      INFO(what << ": " << wrong << " elements differ");
      CHECK(wrong == 0);
    };
    each(d_params.download(), params, "params");
    each(d_exp_avg.download(), exp_avg, "exp_avg");
    each(d_exp_avg_sq.download(), exp_avg_sq, "exp_avg_sq");
  }
  CHECK_THROWS_AS(dev::adamw_step(gpu.launch(), d_params.get(), d_params.get(), d_exp_avg.get(),
                                  d_exp_avg_sq.get(), n, 0, o.lr, o.beta1, o.beta2, o.eps,
                                  o.weight_decay),
                  std::invalid_argument);
}

TEST_CASE("kernels::cuda kernels queue nothing for empty inputs") {
  Gpu gpu;
  const auto& l = gpu.launch();
  float* none = nullptr;
  const std::int32_t* no_tokens = nullptr;
  CHECK_NOTHROW(dev::embedding_forward(l, none, no_tokens, none, none, 0, 7, 33));
  CHECK_NOTHROW(dev::embedding_backward(l, none, none, none, no_tokens, 2, 0, 33));
  CHECK_NOTHROW(dev::linear_forward(l, none, none, none, none, 0, 33, 37, false));
  CHECK_NOTHROW(dev::linear_backward(l, none, none, none, none, none, none, 14, 33, 0));
  CHECK_NOTHROW(dev::layernorm_forward(l, none, none, none, none, none, none, 0, 33, 1e-5f));
  CHECK_NOTHROW(dev::layernorm_backward(l, none, none, none, none, none, none, none, none, 0, 33));
  CHECK_NOTHROW(dev::rmsnorm_forward(l, none, none, none, none, 14, 0, 1e-5f));
  CHECK_NOTHROW(dev::rmsnorm_backward(l, none, none, none, none, none, none, 0, 33));
  CHECK_NOTHROW(dev::rope_forward(l, none, 0, 7, 4, 8, 1e4));
  CHECK_NOTHROW(dev::rope_backward(l, none, 2, 7, 4, 1, 1e4));  // no pair in a head of one
  CHECK_NOTHROW(dev::attention_forward(l, none, none, none, none, none, 2, 0, 4, 2, 8));
  CHECK_NOTHROW(dev::attention_backward(l, none, none, none, none, none, none, none, none, none, 0,
                                        7, 4, 2, 8));
  CHECK_NOTHROW(dev::gelu_forward(l, none, none, 0));
  CHECK_NOTHROW(dev::gelu_backward(l, none, none, none, 0));
  CHECK_NOTHROW(dev::swiglu_forward(l, none, none, none, 0));
  CHECK_NOTHROW(dev::swiglu_backward(l, none, none, none, none, none, 0));
  CHECK_NOTHROW(dev::log_softmax_forward(l, none, none, 0, 37));
  CHECK_NOTHROW(dev::nll_loss_forward(l, nullptr, none, no_tokens, 0, 37));
  CHECK_NOTHROW(dev::nll_loss_backward(l, none, no_tokens, 0, 37, 1.0f));
  CHECK_NOTHROW(dev::log_softmax_backward(l, none, none, none, 14, 0));
  CHECK_NOTHROW(dev::copy(l, none, none, 0));
  CHECK_NOTHROW(dev::add(l, none, none, 0));
  CHECK_NOTHROW(dev::scale(l, none, 2.0f, 0));
  CHECK_NOTHROW(dev::adamw_step(l, none, none, none, none, 0, 1, 1e-3, 0.9, 0.999, 1e-8, 0.0));
  CHECK_NOTHROW(gpu.finish());
}

TEST_CASE("kernels::cuda kernels report bad arguments and failed calls in one line") {
  Gpu gpu;
  DeviceArray<float> buffer(64);
  float* p = buffer.get();
  // heads must be a multiple of kv_heads (grouped-query attention).
  CHECK_THROWS_WITH_AS(dev::attention_forward(gpu.launch(), p, p, p, p, p, 1, 2, 4, 3, 2),
                       doctest::Contains("attention_forward"), std::invalid_argument);
  // A cuBLAS call without a handle fails, and the error names the kernel.
  dev::Launch no_blas;
  no_blas.stream = gpu.stream();
  CHECK_THROWS_WITH_AS(
      dev::linear_forward(no_blas, p, p, p, static_cast<const float*>(nullptr), 2, 2, 2, false),
      doctest::Contains("linear_forward"), std::runtime_error);
  CHECK_NOTHROW(gpu.finish());
}
