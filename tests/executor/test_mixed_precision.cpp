// Mixed precision on the CPU: the kernels and the whole model in bf16 and f16 storage (scalar.hpp:
// every sum in fp32), against fp32 on the same values, and the backend's master-weight ops.
//
// Unit roundoff u of a format with p significant bits (implicit bit included), round to nearest:
// |fl(x) − x| ≤ u·|x|, u = 2^−p. bf16: p = 8, u = 2^−8 ≈ 3.9e-3; f16: p = 11, u = 2^−11 ≈ 4.9e-4.
// Errors are normwise, ‖got − want‖₂ / ‖want‖₂ over a whole output tensor: an output rounded once
// from the same fp32 value has at most u (each element's error is ≤ u·|element|).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "executor/gpt_model.hpp"
#include "executor/synthetic_data.hpp"
#include "kernels/backend.hpp"
#include "kernels/kernels.hpp"
#include "kernels/scalar.hpp"
#include "model_fixture.hpp"

using namespace shardplan;
using namespace shardplan::executor;
using namespace shardplan::kernels;
using namespace shardplan::executor::testing;
using shardplan::documents::ModelSpec;

namespace {

template <class S> constexpr double kUnitRoundoff = std::is_same_v<S, bf16> ? 0x1p-8 : 0x1p-11;

// What the fp32 kernels themselves may differ by where the 16-bit code sums in another order
// (loops against Eigen's GEMMs and vectorised sums): a few fp32 roundings, 2^−16 ≈ 1.5e-5, below
// f16's u by a factor 32.
constexpr double kFp32Order = 0x1p-16;

template <class S> std::vector<S> to_s(const std::vector<float>& v) {
  std::vector<S> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = narrow<S>(v[i]);
  return out;
}

template <class S> std::vector<float> to_f(const std::vector<S>& v) {
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = widen(v[i]);
  return out;
}

// n values uniform in (−a, a), rounded to S: the inputs both kernels read exactly.
template <class S> std::vector<float> rounded(std::mt19937_64& gen, std::int64_t n, double a) {
  std::uniform_real_distribution<float> u(static_cast<float>(-a), static_cast<float>(a));
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = widen(narrow<S>(u(gen)));
  return v;
}

double norm(std::span<const float> v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * static_cast<double>(x);
  return std::sqrt(s);
}

double relative_l2(std::span<const float> got, std::span<const float> want) {
  double d = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double e = static_cast<double>(got[i]) - static_cast<double>(want[i]);
    d += e * e;
  }
  return std::sqrt(d) / norm(want);
}

// ‖got − want‖₂ / ‖want‖₂ with got widened to fp32.
template <class S> double rel_l2(const std::vector<S>& got, const std::vector<float>& want) {
  return relative_l2(to_f(got), want);
}

// Starting values of a gradient a backward kernel adds into: rounded values of the size (rms) of
// what it adds, so that a wrong sum and a lost old value both show.
template <class S>
std::vector<float> start_like(std::mt19937_64& gen, const std::vector<float>& added) {
  const double rms = norm(added) / std::sqrt(static_cast<double>(added.size()));
  return rounded<S>(gen, static_cast<std::int64_t>(added.size()), rms);
}

void expect_within(const std::string& type, const std::string& what, double error,
                   double tolerance) {
  MESSAGE(type << " " << what << ": relative error " << error << " (tolerance " << tolerance
               << ")");
  CHECK(error <= tolerance);
}

// The shapes every kernel below runs at.
namespace sizes {
constexpr std::int64_t B = 2, T = 8, C = 16, V = 50, I = 24, H = 4, KVH = 2, D = 6;
constexpr std::int64_t N = B * T;
}  // namespace sizes

// embedding forward: wte[token] + wpe[t], one rounding.
template <class S>
void check_embedding_forward(const std::string& type, std::mt19937_64& gen,
                             const std::vector<std::int32_t>& tokens) {
  using namespace sizes;
  const double one = kUnitRoundoff<S> + kFp32Order;
  const auto wte = rounded<S>(gen, V * C, 1), wpe = rounded<S>(gen, T * C, 1);
  std::vector<float> y(N * C);
  std::vector<S> y16(N * C);
  kernels::embedding_forward(y.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  kernels::embedding_forward(y16.data(), tokens.data(), to_s<S>(wte).data(), to_s<S>(wpe).data(), B,
                             T, C);
  expect_within(type, "embedding_forward", rel_l2(y16, y), one);
}

// embedding backward: a row's tokens summed in fp32, one rounding.
template <class S>
void check_embedding_backward(const std::string& type, std::mt19937_64& gen,
                              const std::vector<std::int32_t>& tokens) {
  using namespace sizes;
  const double one = kUnitRoundoff<S> + kFp32Order;
  const auto dy = rounded<S>(gen, N * C, 1);
  std::vector<float> dwte(V * C), dwpe(T * C);
  kernels::embedding_backward(dwte.data(), dwpe.data(), dy.data(), tokens.data(), B, T, C);
  dwte = start_like<S>(gen, dwte);
  dwpe = start_like<S>(gen, dwpe);
  auto dwte16 = to_s<S>(dwte), dwpe16 = to_s<S>(dwpe);
  kernels::embedding_backward(dwte.data(), dwpe.data(), dy.data(), tokens.data(), B, T, C);
  kernels::embedding_backward(dwte16.data(), dwpe16.data(), to_s<S>(dy).data(), tokens.data(), B, T,
                              C);
  expect_within(type, "embedding_backward dwte", rel_l2(dwte16, dwte), one);
  expect_within(type, "embedding_backward dwpe", rel_l2(dwpe16, dwpe), one);
}

// linear: y = x·wᵀ + b, then y += x·wᵀ + b; backward into dx, dw, db.
template <class S> void check_linear(const std::string& type, std::mt19937_64& gen) {
  using namespace sizes;
  const double one = kUnitRoundoff<S> + kFp32Order;
  const auto x = rounded<S>(gen, N * C, 1), w = rounded<S>(gen, I * C, 0.5),
             b = rounded<S>(gen, I, 0.5), dy = rounded<S>(gen, N * I, 1);
  const auto x16 = to_s<S>(x), w16 = to_s<S>(w), b16 = to_s<S>(b), dy16 = to_s<S>(dy);
  std::vector<float> y(N * I);
  std::vector<S> y16(N * I);
  kernels::linear_forward(y.data(), x.data(), w.data(), b.data(), N, C, I, false);
  kernels::linear_forward(y16.data(), x16.data(), w16.data(), b16.data(), N, C, I, false);
  expect_within(type, "linear_forward", rel_l2(y16, y), one);
  y = to_f(y16);  // accumulate onto the same S values
  kernels::linear_forward(y.data(), x.data(), w.data(), b.data(), N, C, I, true);
  kernels::linear_forward(y16.data(), x16.data(), w16.data(), b16.data(), N, C, I, true);
  expect_within(type, "linear_forward accumulate", rel_l2(y16, y), one);

  std::vector<float> dx(N * C), dw(I * C), db(I);
  kernels::linear_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), N, C, I);
  dx = start_like<S>(gen, dx);
  dw = start_like<S>(gen, dw);
  db = start_like<S>(gen, db);
  auto dx16 = to_s<S>(dx), dw16 = to_s<S>(dw), db16 = to_s<S>(db);
  kernels::linear_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), N, C, I);
  kernels::linear_backward(dx16.data(), dw16.data(), db16.data(), dy16.data(), x16.data(),
                           w16.data(), N, C, I);
  expect_within(type, "linear_backward dx", rel_l2(dx16, dx), one);
  expect_within(type, "linear_backward dw", rel_l2(dw16, dw), one);
  expect_within(type, "linear_backward db", rel_l2(db16, db), one);
}

// LayerNorm and RMSNorm, forward and backward. x has an offset, so the mean matters.
template <class S> void check_norms(const std::string& type, std::mt19937_64& gen) {
  using namespace sizes;
  const double one = kUnitRoundoff<S> + kFp32Order;
  const double exact = 0x1p-20;
  auto x = rounded<S>(gen, N * C, 1);
  for (auto& v : x) v = widen(narrow<S>(v + 0.5f));
  const auto w = rounded<S>(gen, C, 1), b = rounded<S>(gen, C, 0.5), dy = rounded<S>(gen, N * C, 1);
  const auto x16 = to_s<S>(x), w16 = to_s<S>(w), b16 = to_s<S>(b), dy16 = to_s<S>(dy);
  std::vector<float> y(N * C), mean(N), rstd(N), mean16(N), rstd16(N);
  std::vector<S> y16(N * C);
  kernels::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
                             1e-5f);
  kernels::layernorm_forward(y16.data(), mean16.data(), rstd16.data(), x16.data(), w16.data(),
                             b16.data(), N, C, 1e-5f);
  expect_within(type, "layernorm_forward y", rel_l2(y16, y), one);
  expect_within(type, "layernorm_forward mean (fp32)", rel_l2(mean16, mean), exact);
  expect_within(type, "layernorm_forward rstd (fp32)", rel_l2(rstd16, rstd), exact);

  std::vector<float> dx(N * C), dw(C), db(C);
  kernels::layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(),
                              mean.data(), rstd.data(), N, C);
  dx = start_like<S>(gen, dx);
  dw = start_like<S>(gen, dw);
  db = start_like<S>(gen, db);
  auto dx16 = to_s<S>(dx), dw16 = to_s<S>(dw), db16 = to_s<S>(db);
  kernels::layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(),
                              mean.data(), rstd.data(), N, C);
  kernels::layernorm_backward(dx16.data(), dw16.data(), db16.data(), dy16.data(), x16.data(),
                              w16.data(), mean.data(), rstd.data(), N, C);
  expect_within(type, "layernorm_backward dx", rel_l2(dx16, dx), one);
  expect_within(type, "layernorm_backward dw", rel_l2(dw16, dw), one);
  expect_within(type, "layernorm_backward db", rel_l2(db16, db), one);

  kernels::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
  kernels::rmsnorm_forward(y16.data(), rstd16.data(), x16.data(), w16.data(), N, C, 1e-5f);
  expect_within(type, "rmsnorm_forward y", rel_l2(y16, y), one);
  expect_within(type, "rmsnorm_forward rstd (fp32)", rel_l2(rstd16, rstd), exact);
  std::fill(dx.begin(), dx.end(), 0.0f);
  std::fill(dw.begin(), dw.end(), 0.0f);
  kernels::rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N, C);
  dx = start_like<S>(gen, dx);
  dw = start_like<S>(gen, dw);
  dx16 = to_s<S>(dx);
  dw16 = to_s<S>(dw);
  kernels::rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N, C);
  kernels::rmsnorm_backward(dx16.data(), dw16.data(), dy16.data(), x16.data(), w16.data(),
                            rstd.data(), N, C);
  expect_within(type, "rmsnorm_backward dx", rel_l2(dx16, dx), one);
  expect_within(type, "rmsnorm_backward dw", rel_l2(dw16, dw), one);
}

// Rotary, forward and backward (in place).
template <class S> void check_rope(const std::string& type, std::mt19937_64& gen) {
  using namespace sizes;
  const double one = kUnitRoundoff<S> + kFp32Order;
  auto x = rounded<S>(gen, N * H * D, 1);
  auto x16 = to_s<S>(x);
  kernels::rope_forward(x.data(), B, T, H, D, 10000.0);
  kernels::rope_forward(x16.data(), B, T, H, D, 10000.0);
  expect_within(type, "rope_forward", rel_l2(x16, x), one);
  x = to_f(x16);
  kernels::rope_backward(x.data(), B, T, H, D, 10000.0);
  kernels::rope_backward(x16.data(), B, T, H, D, 10000.0);
  expect_within(type, "rope_backward", rel_l2(x16, x), one);
}

// Attention with grouped-query heads (4 query heads on 2 key/value heads).
template <class S> void check_attention(const std::string& type, std::mt19937_64& gen) {
  using namespace sizes;
  const double u = kUnitRoundoff<S>;
  const double one = kUnitRoundoff<S> + kFp32Order;
  const auto q = rounded<S>(gen, N * H * D, 1.5), k = rounded<S>(gen, N * KVH * D, 1.5),
             v = rounded<S>(gen, N * KVH * D, 1), dout = rounded<S>(gen, N * H * D, 1);
  const auto q16 = to_s<S>(q), k16 = to_s<S>(k), v16 = to_s<S>(v), dout16 = to_s<S>(dout);
  std::vector<float> out(N * H * D), probs(B * H * T * T), out_abs(N * H * D);
  std::vector<S> out16(N * H * D), probs16(B * H * T * T);
  kernels::attention_forward(out.data(), probs.data(), q.data(), k.data(), v.data(), B, T, H, KVH,
                             D);
  kernels::attention_forward(out16.data(), probs16.data(), q16.data(), k16.data(), v16.data(), B, T,
                             H, KVH, D);
  std::vector<float> v_abs(v);
  for (auto& e : v_abs) e = std::abs(e);
  kernels::attention_forward(out_abs.data(), probs.data(), q.data(), k.data(), v_abs.data(), B, T,
                             H, KVH, D);
  const double kappa = norm(out_abs) / norm(out);
  MESSAGE(type << " attention_forward: κ = ‖P·|V|‖/‖P·V‖ = " << kappa);
  expect_within(type, "attention_forward probs", rel_l2(probs16, probs), one);
  expect_within(type, "attention_forward out", rel_l2(out16, out), (1 + kappa) * u + kFp32Order);

  // The backward reads the S probabilities, both kernels the same values.
  probs = to_f(probs16);
  std::vector<float> dq(N * H * D), dk(N * KVH * D), dv(N * KVH * D), scratch(T * T);
  std::vector<S> scratch16(T * T);
  kernels::attention_backward(dq.data(), dk.data(), dv.data(), scratch.data(), dout.data(),
                              probs.data(), q.data(), k.data(), v.data(), B, T, H, KVH, D);
  dq = start_like<S>(gen, dq);
  dk = start_like<S>(gen, dk);
  dv = start_like<S>(gen, dv);
  auto dq16 = to_s<S>(dq), dk16 = to_s<S>(dk), dv16 = to_s<S>(dv);
  kernels::attention_backward(dq.data(), dk.data(), dv.data(), scratch.data(), dout.data(),
                              probs.data(), q.data(), k.data(), v.data(), B, T, H, KVH, D);
  kernels::attention_backward(dq16.data(), dk16.data(), dv16.data(), scratch16.data(),
                              dout16.data(), probs16.data(), q16.data(), k16.data(), v16.data(), B,
                              T, H, KVH, D);
  const double attention_backward = 4 * u + kFp32Order;
  expect_within(type, "attention_backward dq", rel_l2(dq16, dq), attention_backward);
  expect_within(type, "attention_backward dk", rel_l2(dk16, dk), attention_backward);
  expect_within(type, "attention_backward dv", rel_l2(dv16, dv), attention_backward);
}

// GELU and SwiGLU, forward and backward.
template <class S> void check_activations(const std::string& type, std::mt19937_64& gen) {
  using namespace sizes;
  const double one = kUnitRoundoff<S> + kFp32Order;
  const auto a = rounded<S>(gen, N * I, 3), g = rounded<S>(gen, N * I, 3),
             dy = rounded<S>(gen, N * I, 1);
  const auto a16 = to_s<S>(a), g16 = to_s<S>(g), dy16 = to_s<S>(dy);
  std::vector<float> y(N * I);
  std::vector<S> y16(N * I);
  kernels::gelu_forward(y.data(), a.data(), N * I);
  kernels::gelu_forward(y16.data(), a16.data(), N * I);
  expect_within(type, "gelu_forward", rel_l2(y16, y), one);
  kernels::swiglu_forward(y.data(), a.data(), g.data(), N * I);
  kernels::swiglu_forward(y16.data(), a16.data(), g16.data(), N * I);
  expect_within(type, "swiglu_forward", rel_l2(y16, y), one);

  std::vector<float> din(N * I), dup(N * I);
  kernels::gelu_backward(din.data(), a.data(), dy.data(), N * I);
  din = start_like<S>(gen, din);
  auto din16 = to_s<S>(din);
  kernels::gelu_backward(din.data(), a.data(), dy.data(), N * I);
  kernels::gelu_backward(din16.data(), a16.data(), dy16.data(), N * I);
  expect_within(type, "gelu_backward", rel_l2(din16, din), one);
  std::fill(din.begin(), din.end(), 0.0f);
  kernels::swiglu_backward(din.data(), dup.data(), dy.data(), a.data(), g.data(), N * I);
  din = start_like<S>(gen, din);
  dup = start_like<S>(gen, dup);
  din16 = to_s<S>(din);
  auto dup16 = to_s<S>(dup);
  kernels::swiglu_backward(din.data(), dup.data(), dy.data(), a.data(), g.data(), N * I);
  kernels::swiglu_backward(din16.data(), dup16.data(), dy16.data(), a16.data(), g16.data(), N * I);
  expect_within(type, "swiglu_backward dgate", rel_l2(din16, din), one);
  expect_within(type, "swiglu_backward dup", rel_l2(dup16, dup), one);
}

// The loss: log-probabilities and their gradient in fp32, the logits' gradient in S.
template <class S>
void check_loss(const std::string& type, std::mt19937_64& gen,
                const std::vector<std::int32_t>& tokens) {
  using namespace sizes;
  const double one = kUnitRoundoff<S> + kFp32Order;
  const double exact = 0x1p-20;
  const auto z = rounded<S>(gen, N * V, 4);
  std::vector<float> logp(N * V), logp16(N * V), dlogp(N * V), dlogp16(N * V), dz(N * V);
  std::vector<S> dz16(N * V);
  kernels::log_softmax_forward(logp.data(), z.data(), N, V);
  kernels::log_softmax_forward(logp16.data(), to_s<S>(z).data(), N, V);
  expect_within(type, "log_softmax_forward (fp32)", rel_l2(logp16, logp), exact);
  const double loss = kernels::nll_loss_forward<float>(logp.data(), tokens.data(), N, V);
  const double loss16 = kernels::nll_loss_forward<S>(logp16.data(), tokens.data(), N, V);
  expect_within(type, "nll_loss_forward (fp32)", std::abs(loss16 - loss) / loss, exact);
  kernels::nll_loss_backward<float>(dlogp.data(), tokens.data(), N, V, 1.0f / N);
  kernels::nll_loss_backward<S>(dlogp16.data(), tokens.data(), N, V, 1.0f / N);
  expect_within(type, "nll_loss_backward (fp32)", rel_l2(dlogp16, dlogp), exact);
  kernels::log_softmax_backward(dz.data(), dlogp.data(), logp.data(), N, V);
  kernels::log_softmax_backward(dz16.data(), dlogp.data(), logp.data(), N, V);
  expect_within(type, "log_softmax_backward", rel_l2(dz16, dz), one);
}

// Every kernel in S against the same kernel in fp32 on the same inputs (rounded to S). Tolerances,
// in units of u:
//   1 for an output rounded once from an fp32 value computed the same way (every element-wise
//     kernel, the norms, rotary, the linear layers, the embedding's sums: all sums in fp32, one
//     rounding where the S element is written, a backward's old value included);
//   0 (to fp32 roundoff, 2^−20) for the fp32 outputs: norm statistics, log-probabilities, the loss;
//   attention forward: its output is P̂·V with P̂ the probabilities rounded to S; with
//     |P̂ − P| ≤ u·P, |ΔO| ≤ u·P·|V| + u·|O| (the output's rounding): (1 + κ)·u, κ = ‖P·|V|‖/‖P·V‖,
//     measured here by running the fp32 kernel on |V|;
//   attention backward: dS is rounded to S before dQ = dS·K and dK = dSᵀ·Q, which carry its
//     error as u·‖|dS|·|K|‖ = κ·u·‖dS·K‖ (a sum over ≤ T = 8 keys of both signs: κ ≈ 1–2 for
//     random rows). dQ: its own rounding and dS's, (1 + κ)·u. dK, dV: rounded once per query
//     head of their group (2 here, each time a partial sum of about the final's size), dK also
//     dS's: (2 + κ)·u. Tolerance 4u for all three.
template <class S> void kernels_against_fp32(const std::string& type) {
  using namespace sizes;
  std::mt19937_64 gen(2024);
  std::vector<std::int32_t> tokens(N);
  std::uniform_int_distribution<std::int32_t> tok(0, V - 1);
  for (auto& t : tokens) t = tok(gen);
  tokens[9] = tokens[2];  // a wte row for three tokens
  tokens[12] = tokens[2];
  check_embedding_forward<S>(type, gen, tokens);
  check_embedding_backward<S>(type, gen, tokens);
  check_linear<S>(type, gen);
  check_norms<S>(type, gen);
  check_rope<S>(type, gen);
  check_attention<S>(type, gen);
  check_activations<S>(type, gen);
  check_loss<S>(type, gen, tokens);
}

}  // namespace

TEST_CASE("mixed_precision::bf16 kernels against fp32") { kernels_against_fp32<bf16>("bf16"); }

TEST_CASE("mixed_precision::f16 kernels against fp32") { kernels_against_fp32<f16>("f16"); }

namespace {

constexpr BatchShape kShape{2, 8};

struct ModelResult {
  double loss = 0;
  std::vector<std::vector<float>> grads;  // per unit, widened to fp32
};

// Forward and backward of the whole model in S from fp32 parameters narrowed to S (a
// mixed-precision step's compute copy of its fp32 master weights), gradients from zero.
template <class S>
ModelResult run_model(const ModelSpec& spec, const std::vector<std::vector<float>>& params,
                      const TokenBatch& batch, Checkpointing checkpointing) {
  TrackedAllocator allocator;
  GptModel<S> model(spec, allocator);
  std::vector<TrackedBuffer<S>> p, g;
  for (const auto& unit : params) {
    p.push_back(narrowed<S>(allocator, MemoryCategory::parameters, unit));
    g.push_back(allocator.allocate<S>(MemoryCategory::gradients, std::ssize(unit)));
  }
  ModelResult r;
  r.loss = forward_backward(model, p, g, batch.inputs.span(), batch.targets.span(), kShape,
                            checkpointing, true);
  for (const auto& unit : g)
    r.grads.emplace_back(to_f(std::vector<S>(unit.span().begin(), unit.span().end())));
  return r;
}

// The parameters of the tests' tiny models, moved off their initial values (norm weights off 1,
// biases off 0), and the same values rounded to S and back.
std::vector<std::vector<float>> model_params(const ModelSpec& spec) {
  TrackedAllocator allocator;
  WholeModel<float> m(spec, allocator, 31);
  m.perturb(32, 0.1);
  std::vector<std::vector<float>> params;
  for (const auto& b : m.params) params.emplace_back(b.span().begin(), b.span().end());
  return params;
}

template <class S>
std::vector<std::vector<float>> rounded_params(const std::vector<std::vector<float>>& params) {
  std::vector<std::vector<float>> out;
  out.reserve(params.size());
  for (const auto& unit : params) out.push_back(to_f(to_s<S>(unit)));
  return out;
}

struct ModelErrors {
  double loss = 0;              // |L₁₆ − L₃₂| / L₃₂
  std::vector<double> grads;    // per unit, ‖g₁₆ − g₃₂‖ / ‖g₃₂‖
  std::vector<double> compute;  // the same against fp32 on the rounded parameters
};

template <class S>
ModelErrors model_errors(const ModelSpec& spec, const std::string& type, double loss_tolerance,
                         double grad_tolerance) {
  const auto params = model_params(spec);
  TrackedAllocator allocator;
  const auto batch = synthetic_batch(allocator, 33, kShape, spec.vocab);
  const auto fp32 = run_model<float>(spec, params, batch, Checkpointing::none);
  const auto fp32_rounded =
      run_model<float>(spec, rounded_params<S>(params), batch, Checkpointing::none);
  const auto low = run_model<S>(spec, params, batch, Checkpointing::none);
  ModelErrors e;
  e.loss = std::abs(low.loss - fp32.loss) / fp32.loss;
  MESSAGE(spec.name << " " << type << ": loss " << low.loss << " against fp32 " << fp32.loss
                    << ", relative error " << e.loss << " (tolerance " << loss_tolerance << ")");
  CHECK(e.loss <= loss_tolerance);
  for (std::size_t u = 0; u < params.size(); ++u) {
    e.grads.push_back(rel_l2(low.grads[u], fp32.grads[u]));
    e.compute.push_back(rel_l2(low.grads[u], fp32_rounded.grads[u]));
    MESSAGE(spec.name << " " << type << " unit " << u << ": gradient relative L2 error "
                      << e.grads[u] << " (tolerance " << grad_tolerance
                      << "); against fp32 on the rounded parameters " << e.compute[u]);
    CHECK(e.grads[u] <= grad_tolerance);
  }

  // Recomputing a block in its backward gives bitwise the stored path's gradients, in S too.
  const auto recomputed = run_model<S>(spec, params, batch, Checkpointing::full);
  CHECK(recomputed.loss == low.loss);
  for (std::size_t u = 0; u < params.size(); ++u)
    CHECK_EQ(std::memcmp(recomputed.grads[u].data(), low.grads[u].data(),
                         low.grads[u].size() * sizeof(float)),
             0);
  return e;
}

}  // namespace

// Tolerances of the whole model (the tiny models: 2 blocks, N = 16 tokens, vocabulary 50), for
// S parameters narrowed from the fp32 ones, against fp32 on the fp32 parameters:
// Loss, relative: u. L = mean over the tokens of lse(z) − z_target; a relative error ε of the
//   logits moves a token's term by at most 2ε·max|z|. ε is the activations': each of the ~25 S
//   tensors on the way to the logits (parameters, embedding; per block the norm, q, k, v, the
//   probabilities, the attention output, the residual, the second norm, the MLP's two; the final
//   norm, the logits) adds a rounding ≤ u of random sign, ≈ √25·u/√3 ≈ 3u RMS. With |z| ≲ 1 (L is
//   close to ln 50 ≈ 3.9, the uniform prediction's), |ΔL|/L ≲ 2·3u/3.9 ≈ 1.5u per token, and the
//   mean over 16 tokens of independent errors divides that by about 4: ≲ 0.4u, bound u.
//   Measured: bf16 ≤ 0.05u, f16 ≤ 0.03u.
// Gradients, relative L2 per unit: 8u. A parameter's gradient multiplies forward activations
//   (rounded as above) and backward gradients, which the backward rounds once more per S tensor:
//   about 50 roundings ≤ u on the longest path through 2 blocks, ≈ √50·u/√3 ≈ 4u RMS with
//   independent signs; the norms and softmaxes are well conditioned here (rows of O(1) spread),
//   and the bound allows twice that. Measured: bf16 1.2u–2.1u, f16 0.9u–2.3u.
TEST_CASE("mixed_precision::whole model in bf16 and f16 against fp32") {
  for (const auto& spec : {tiny_gpt2(), tiny_llama()}) {
    CAPTURE(spec.name);
    const double bu = kUnitRoundoff<bf16>, hu = kUnitRoundoff<f16>;
    const auto b = model_errors<bf16>(spec, "bf16", bu, 8 * bu);
    const auto h = model_errors<f16>(spec, "f16", hu, 8 * hu);
    // Really computed in 16-bit storage: against fp32 on the same rounded parameters the bf16
    // gradients still differ by at least u/8 (an fp32 computation would differ by ~1e-6), and
    // f16's 3 more bits make its errors smaller.
    for (std::size_t u = 0; u < b.grads.size(); ++u) {
      CAPTURE(u);
      CHECK(b.compute[u] > kUnitRoundoff<bf16> / 8);
      CHECK(h.compute[u] < b.compute[u]);
      CHECK(h.grads[u] < b.grads[u]);
    }
  }
}

// The master-weight ops of mixed precision (backend.hpp) on the host.
TEST_CASE("mixed_precision::host backend narrow, widen_add, scale, all_finite") {
  HostBackend<bf16> be;
  // narrow: round to nearest even. 1 + 2^−8 is halfway between 1 and 1 + 2^−7 (bf16's spacing at
  // 1): to the even 1. 1 + 3·2^−8 is halfway between 1 + 2^−7 and 1 + 2^−6: to the even 1 + 2^−6.
  const std::vector<float> master = {1.0f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -2.5f, 1e-3f};
  std::vector<bf16> low(master.size());
  be.narrow(low.data(), master.data(), std::ssize(master));
  CHECK(widen(low[0]) == 1.0f);
  CHECK(widen(low[1]) == 1.0f);
  CHECK(widen(low[2]) == 1.0f + 0x1p-6f);
  CHECK(widen(low[3]) == -2.5f);
  CHECK(std::abs(static_cast<double>(widen(low[4])) - 1e-3) <= kUnitRoundoff<bf16> * 1e-3);
  CHECK(low[0].bits == 0x3F80);

  // widen_add: dst += the exact fp32 value of each bf16.
  std::vector<float> acc = {0.5f, 0.25f, -1.0f, 2.5f, 0.0f};
  be.widen_add(acc.data(), low.data(), std::ssize(acc));
  CHECK(acc[0] == 1.5f);
  CHECK(acc[1] == 1.25f);
  CHECK(acc[2] == 0x1p-6f);
  CHECK(acc[3] == 0.0f);
  CHECK(acc[4] == widen(low[4]));

  // scale: x *= factor in fp32 (a loss scale's inverse, 1/M over micro-batches).
  std::vector<float> x = {1.0f, -3.0f, 65536.0f};
  be.scale(x.data(), std::ssize(x), 0.25);
  CHECK(x[0] == 0.25f);
  CHECK(x[1] == -0.75f);
  CHECK(x[2] == 16384.0f);

  // all_finite: false as soon as one element is ±inf or NaN.
  std::vector<float> f = {0.0f, -1.0f, 3e38f, 1e-40f};
  CHECK(be.all_finite(f.data(), std::ssize(f)));
  CHECK(be.all_finite(f.data(), 0));
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    CAPTURE(bad);
    auto g = f;
    g[2] = bad;
    CHECK_FALSE(be.all_finite(g.data(), std::ssize(g)));
  }

  // f16: a gradient past 65504 overflows to inf when narrowed, and the widened sum shows it.
  HostBackend<f16> half;
  const std::vector<float> big = {1.0f, 70000.0f};
  std::vector<f16> big16(2);
  half.narrow(big16.data(), big.data(), 2);
  CHECK(big16[1].bits == 0x7C00);
  std::vector<float> sum = {0.0f, 0.0f};
  half.widen_add(sum.data(), big16.data(), 2);
  CHECK(sum[0] == 1.0f);
  CHECK_FALSE(half.all_finite(sum.data(), 2));
  CHECK(half.all_finite(sum.data(), 1));
}
