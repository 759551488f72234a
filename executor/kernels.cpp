#include "executor/kernels.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include <bit>
#include <type_traits>

#include <Eigen/Core>

namespace shardplan::executor::kernels {
namespace {

template <class S>
using RowMajor = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class S>
using MatrixMap = Eigen::Map<RowMajor<S>>;
template <class S>
using ConstMatrixMap = Eigen::Map<const RowMajor<S>>;
template <class S>
using RowVectorMap = Eigen::Map<Eigen::Matrix<S, 1, Eigen::Dynamic>>;
template <class S>
using ArrayMap = Eigen::Map<Eigen::Array<S, 1, Eigen::Dynamic>>;
template <class S>
using ConstArrayMap = Eigen::Map<const Eigen::Array<S, 1, Eigen::Dynamic>>;
// exp(x) for the kernels' element-wise loops. fp32: Cephes' expf (Moshier 1984, cephes/single/
// expf.c): x = n·ln2 + r with |r| ≤ ln2/2, exp(r) by its degree-5 minimax polynomial, times 2ⁿ
// built in the exponent bits; no calls, so the loops that use it are vectorised (with
// -fno-trapping-math, see CMakeLists.txt; libm's expf is a call per element: ~5 ns against ~1 ns), relative error ≤ 1e-7 (1 ulp) on
// [−87, 88], inputs clamped to that range (exp(−87) ≈ 1.6e-38 is the smallest normal float's
// order; a softmax never needs less). fp64 (the gradient check): std::exp.
template <class S>
inline S exp_fast(S x) {
  if constexpr (std::is_same_v<S, float>) {
    x = std::min(std::max(x, -87.3f), 88.7f);
    const int k = static_cast<int>(x * 1.44269504088896341f + 128.5f) - 128;  // round(x·log2 e)
    const float n = static_cast<float>(k);
    const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;  // ln 2 in two parts
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    return p * std::bit_cast<float>((k + 127) << 23);
  } else {
    return std::exp(x);
  }
}

template <class S>
using ConstRowVectorMap = Eigen::Map<const Eigen::Matrix<S, 1, Eigen::Dynamic>>;

}  // namespace

template <class S>
void embedding_forward(S* out, const std::int32_t* tokens, const S* wte, const S* wpe,
                       std::int64_t batch, std::int64_t seq, std::int64_t channels) {
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t t = 0; t < seq; ++t) {
      const std::int64_t n = b * seq + t;
      S* o = out + n * channels;
      const S* e = wte + static_cast<std::int64_t>(tokens[n]) * channels;
      for (std::int64_t c = 0; c < channels; ++c) o[c] = e[c];
      if (wpe) {
        const S* p = wpe + t * channels;
        for (std::int64_t c = 0; c < channels; ++c) o[c] += p[c];
      }
    }
}

template <class S>
void embedding_backward(S* dwte, S* dwpe, const S* dout, const std::int32_t* tokens,
                        std::int64_t batch, std::int64_t seq, std::int64_t channels) {
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t t = 0; t < seq; ++t) {
      const std::int64_t n = b * seq + t;
      const S* d = dout + n * channels;
      S* e = dwte + static_cast<std::int64_t>(tokens[n]) * channels;
      for (std::int64_t c = 0; c < channels; ++c) e[c] += d[c];
      if (dwpe) {
        S* p = dwpe + t * channels;
        for (std::int64_t c = 0; c < channels; ++c) p[c] += d[c];
      }
    }
}

template <class S>
void linear_forward(S* y, const S* x, const S* w, const S* b, std::int64_t n, std::int64_t in,
                    std::int64_t out, bool accumulate) {
  MatrixMap<S> Y(y, n, out);
  ConstMatrixMap<S> X(x, n, in);
  ConstMatrixMap<S> W(w, out, in);
  if (accumulate)
    Y.noalias() += X * W.transpose();
  else
    Y.noalias() = X * W.transpose();
  if (b) Y.rowwise() += ConstRowVectorMap<S>(b, out);
}

template <class S>
void linear_backward(S* dx, S* dw, S* db, const S* dy, const S* x, const S* w, std::int64_t n,
                     std::int64_t in, std::int64_t out) {
  ConstMatrixMap<S> dY(dy, n, out);
  if (dx) MatrixMap<S>(dx, n, in).noalias() += dY * ConstMatrixMap<S>(w, out, in);
  MatrixMap<S>(dw, out, in).noalias() += dY.transpose() * ConstMatrixMap<S>(x, n, in);
  if (db) RowVectorMap<S>(db, out) += dY.colwise().sum();
}

template <class S>
void layernorm_forward(S* y, accum_t<S>* mean, accum_t<S>* rstd, const S* x, const S* w, const S* b, std::int64_t n,
                       std::int64_t channels, accum_t<S> eps) {
  const S inv_c = S(1) / static_cast<S>(channels);
  for (std::int64_t i = 0; i < n; ++i) {
    const S* xi = x + i * channels;
    S m = 0;
    for (std::int64_t c = 0; c < channels; ++c) m += xi[c];
    m *= inv_c;
    S var = 0;
    for (std::int64_t c = 0; c < channels; ++c) var += (xi[c] - m) * (xi[c] - m);
    var *= inv_c;
    const S r = S(1) / std::sqrt(var + eps);
    S* yi = y + i * channels;
    for (std::int64_t c = 0; c < channels; ++c) yi[c] = (xi[c] - m) * r * w[c] + b[c];
    mean[i] = m;
    rstd[i] = r;
  }
}

template <class S>
void layernorm_backward(S* dx, S* dw, S* db, const S* dy, const S* x, const S* w, const accum_t<S>* mean,
                        const accum_t<S>* rstd, std::int64_t n, std::int64_t channels) {
  const S inv_c = S(1) / static_cast<S>(channels);
  for (std::int64_t i = 0; i < n; ++i) {
    const S* dyi = dy + i * channels;
    const S* xi = x + i * channels;
    const S m = mean[i], r = rstd[i];
    S g_mean = 0, gx_mean = 0;
    for (std::int64_t c = 0; c < channels; ++c) {
      const S xhat = (xi[c] - m) * r;
      const S g = dyi[c] * w[c];
      g_mean += g;
      gx_mean += g * xhat;
    }
    g_mean *= inv_c;
    gx_mean *= inv_c;
    S* dxi = dx + i * channels;
    for (std::int64_t c = 0; c < channels; ++c) {
      const S xhat = (xi[c] - m) * r;
      const S g = dyi[c] * w[c];
      dxi[c] += r * (g - g_mean - xhat * gx_mean);
      dw[c] += dyi[c] * xhat;
      db[c] += dyi[c];
    }
  }
}

template <class S>
void rmsnorm_forward(S* y, accum_t<S>* rstd, const S* x, const S* w, std::int64_t n, std::int64_t channels,
                     accum_t<S> eps) {
  const S inv_c = S(1) / static_cast<S>(channels);
  for (std::int64_t i = 0; i < n; ++i) {
    const S* xi = x + i * channels;
    S ms = 0;
    for (std::int64_t c = 0; c < channels; ++c) ms += xi[c] * xi[c];
    const S r = S(1) / std::sqrt(ms * inv_c + eps);
    S* yi = y + i * channels;
    for (std::int64_t c = 0; c < channels; ++c) yi[c] = xi[c] * r * w[c];
    rstd[i] = r;
  }
}

template <class S>
void rmsnorm_backward(S* dx, S* dw, const S* dy, const S* x, const S* w, const accum_t<S>* rstd,
                      std::int64_t n, std::int64_t channels) {
  const S inv_c = S(1) / static_cast<S>(channels);
  for (std::int64_t i = 0; i < n; ++i) {
    const S* dyi = dy + i * channels;
    const S* xi = x + i * channels;
    const S r = rstd[i];
    S gx_mean = 0;
    for (std::int64_t c = 0; c < channels; ++c) gx_mean += dyi[c] * w[c] * xi[c] * r;
    gx_mean *= inv_c;
    S* dxi = dx + i * channels;
    for (std::int64_t c = 0; c < channels; ++c) {
      const S xhat = xi[c] * r;
      dxi[c] += r * (dyi[c] * w[c] - xhat * gx_mean);
      dw[c] += dyi[c] * xhat;
    }
  }
}

namespace {

// Rotates every (i, i + d/2) channel pair of every head by ±angle(t, i).
template <class S>
void rotate_pairs(S* x, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                  std::int64_t head_dim, double theta, double direction) {
  const std::int64_t half = head_dim / 2;
  for (std::int64_t t = 0; t < seq; ++t)
    for (std::int64_t i = 0; i < half; ++i) {
      // inv_freq_i = θ^(−2i/d) (HF LlamaRotaryEmbedding), angle in double for every scalar type.
      const double inv_freq =
          std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
      const double angle = static_cast<double>(t) * inv_freq;
      const S c = static_cast<S>(std::cos(angle));
      const S s = static_cast<S>(direction * std::sin(angle));
      for (std::int64_t b = 0; b < batch; ++b)
        for (std::int64_t h = 0; h < heads; ++h) {
          S* p = x + ((b * seq + t) * heads + h) * head_dim;
          const S x1 = p[i], x2 = p[i + half];
          p[i] = x1 * c - x2 * s;
          p[i + half] = x2 * c + x1 * s;
        }
    }
}

}  // namespace

template <class S>
void rope_forward(S* x, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                  std::int64_t head_dim, double theta) {
  rotate_pairs(x, batch, seq, heads, head_dim, theta, 1.0);
}

// The rotation is orthogonal, so the gradient w.r.t. its input is Rᵀ·dy = R(−angle)·dy.
template <class S>
void rope_backward(S* dx, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                   std::int64_t head_dim, double theta) {
  rotate_pairs(dx, batch, seq, heads, head_dim, theta, -1.0);
}

template <class S>
void attention_forward(S* out, S* probs, const S* q, const S* k, const S* v, std::int64_t batch,
                       std::int64_t seq, std::int64_t heads, std::int64_t kv_heads,
                       std::int64_t head_dim) {
  const std::int64_t n = batch * seq, group = heads / kv_heads;
  const S scale = static_cast<S>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  ConstMatrixMap<S> Q(q, n, heads * head_dim), K(k, n, kv_heads * head_dim),
      V(v, n, kv_heads * head_dim);
  MatrixMap<S> O(out, n, heads * head_dim);
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t h = 0; h < heads; ++h) {
      const std::int64_t kvh = h / group;
      auto Qb = Q.block(b * seq, h * head_dim, seq, head_dim);
      auto Kb = K.block(b * seq, kvh * head_dim, seq, head_dim);
      auto Vb = V.block(b * seq, kvh * head_dim, seq, head_dim);
      S* pbh = probs + (b * heads + h) * seq * seq;
      MatrixMap<S> P(pbh, seq, seq);
      P.noalias() = Qb * Kb.transpose();
      // Causal softmax of row t over keys 0..t (a vectorised exp); the masked entries are
      // exactly zero.
      for (std::int64_t t = 0; t < seq; ++t) {
        S* row = pbh + t * seq;
        ArrayMap<S> kept(row, t + 1);
        const S maxv = kept.maxCoeff() * scale;
        for (std::int64_t j = 0; j <= t; ++j) row[j] = exp_fast(row[j] * scale - maxv);
        kept *= S(1) / kept.sum();
        std::fill(row + t + 1, row + seq, S(0));
      }
      O.block(b * seq, h * head_dim, seq, head_dim).noalias() = P * Vb;
    }
}

template <class S>
void attention_backward(S* dq, S* dk, S* dv, S* scratch, const S* dout, const S* probs, const S* q,
                        const S* k, const S* v, std::int64_t batch, std::int64_t seq,
                        std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim) {
  const std::int64_t n = batch * seq, group = heads / kv_heads;
  const S scale = static_cast<S>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  ConstMatrixMap<S> Q(q, n, heads * head_dim), K(k, n, kv_heads * head_dim),
      V(v, n, kv_heads * head_dim), dO(dout, n, heads * head_dim);
  MatrixMap<S> dQ(dq, n, heads * head_dim), dK(dk, n, kv_heads * head_dim),
      dV(dv, n, kv_heads * head_dim);
  MatrixMap<S> dP(scratch, seq, seq);
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t h = 0; h < heads; ++h) {
      const std::int64_t kvh = h / group;
      auto Qb = Q.block(b * seq, h * head_dim, seq, head_dim);
      auto Kb = K.block(b * seq, kvh * head_dim, seq, head_dim);
      auto Vb = V.block(b * seq, kvh * head_dim, seq, head_dim);
      auto dOb = dO.block(b * seq, h * head_dim, seq, head_dim);
      const S* pbh = probs + (b * heads + h) * seq * seq;
      ConstMatrixMap<S> P(pbh, seq, seq);
      dP.noalias() = dOb * Vb.transpose();
      dV.block(b * seq, kvh * head_dim, seq, head_dim).noalias() += P.transpose() * dOb;
      // Softmax backward, row by row: dS = P ∘ (dP − Σⱼ P·dP), times the score scale.
      for (std::int64_t t = 0; t < seq; ++t) {
        const S* prow = pbh + t * seq;
        S* drow = scratch + t * seq;
        S dot = 0;
        for (std::int64_t j = 0; j <= t; ++j) dot += prow[j] * drow[j];
        for (std::int64_t j = 0; j <= t; ++j) drow[j] = prow[j] * (drow[j] - dot) * scale;
        for (std::int64_t j = t + 1; j < seq; ++j) drow[j] = 0;
      }
      dQ.block(b * seq, h * head_dim, seq, head_dim).noalias() += dP * Kb;
      dK.block(b * seq, kvh * head_dim, seq, head_dim).noalias() += dP.transpose() * Qb;
    }
}

namespace {
template <class S>
constexpr S kGeluScale = static_cast<S>(0.7978845608028654);  // √(2/π)
template <class S>
constexpr S kGeluCubic = static_cast<S>(0.044715);
}  // namespace

template <class S>
void gelu_forward(S* out, const S* in, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const S x = in[i];
    out[i] = S(0.5) * x * (S(1) + std::tanh(kGeluScale<S> * (x + kGeluCubic<S> * x * x * x)));
  }
}

template <class S>
void gelu_backward(S* din, const S* in, const S* dout, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const S x = in[i];
    const S th = std::tanh(kGeluScale<S> * (x + kGeluCubic<S> * x * x * x));
    const S sech2 = S(1) - th * th;
    const S local = S(0.5) * (S(1) + th) +
                    S(0.5) * x * sech2 * kGeluScale<S> * (S(1) + S(3) * kGeluCubic<S> * x * x);
    din[i] += local * dout[i];
  }
}

template <class S>
void swiglu_forward(S* out, const S* gate, const S* up, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const S g = gate[i];
    const S sig = S(1) / (S(1) + exp_fast(-g));
    out[i] = g * sig * up[i];
  }
}

template <class S>
void swiglu_backward(S* dgate, S* dup, const S* dout, const S* gate, const S* up, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const S g = gate[i];
    const S sig = S(1) / (S(1) + exp_fast(-g));
    dgate[i] += dout[i] * up[i] * sig * (S(1) + g * (S(1) - sig));
    dup[i] += dout[i] * g * sig;
  }
}

template <class S>
void log_softmax_forward(accum_t<S>* logp, const S* logits, std::int64_t n, std::int64_t vocab) {
  for (std::int64_t i = 0; i < n; ++i) {
    const S* zi = logits + i * vocab;
    S* out = logp + i * vocab;  // holds exp(z − max) first
    const S maxv = ConstArrayMap<S>(zi, vocab).maxCoeff();
    for (std::int64_t j = 0; j < vocab; ++j) out[j] = exp_fast(zi[j] - maxv);
    const S shift = maxv + std::log(ArrayMap<S>(out, vocab).sum());
    for (std::int64_t j = 0; j < vocab; ++j) out[j] = zi[j] - shift;
  }
}

template <class S>
double nll_loss_forward(const accum_t<S>* logp, const std::int32_t* targets, std::int64_t n,
                        std::int64_t vocab) {
  double sum = 0;
  for (std::int64_t i = 0; i < n; ++i) sum -= static_cast<double>(logp[i * vocab + targets[i]]);
  return sum;
}

template <class S>
void nll_loss_backward(accum_t<S>* dlogp, const std::int32_t* targets, std::int64_t n, std::int64_t vocab,
                       accum_t<S> scale) {
  for (std::int64_t i = 0; i < n; ++i) dlogp[i * vocab + targets[i]] -= scale;
}

template <class S>
void log_softmax_backward(S* dlogits, const accum_t<S>* dlogp, const accum_t<S>* logp, std::int64_t n,
                          std::int64_t vocab) {
  for (std::int64_t i = 0; i < n; ++i) {
    const S* g = dlogp + i * vocab;
    const S* lp = logp + i * vocab;
    S* out = dlogits + i * vocab;
    const S sum = ConstArrayMap<S>(g, vocab).sum();
    for (std::int64_t j = 0; j < vocab; ++j) out[j] = g[j] - exp_fast(lp[j]) * sum;
  }
}

#define SHARDPLAN_INSTANTIATE_KERNELS(S)                                                          \
  template void embedding_forward<S>(S*, const std::int32_t*, const S*, const S*, std::int64_t,   \
                                     std::int64_t, std::int64_t);                                 \
  template void embedding_backward<S>(S*, S*, const S*, const std::int32_t*, std::int64_t,        \
                                      std::int64_t, std::int64_t);                                \
  template void linear_forward<S>(S*, const S*, const S*, const S*, std::int64_t, std::int64_t,   \
                                  std::int64_t, bool);                                            \
  template void linear_backward<S>(S*, S*, S*, const S*, const S*, const S*, std::int64_t,        \
                                   std::int64_t, std::int64_t);                                   \
  template void layernorm_forward<S>(S*, S*, S*, const S*, const S*, const S*, std::int64_t,      \
                                     std::int64_t, S);                                            \
  template void layernorm_backward<S>(S*, S*, S*, const S*, const S*, const S*, const S*,         \
                                      const S*, std::int64_t, std::int64_t);                      \
  template void rmsnorm_forward<S>(S*, S*, const S*, const S*, std::int64_t, std::int64_t, S);    \
  template void rmsnorm_backward<S>(S*, S*, const S*, const S*, const S*, const S*, std::int64_t, \
                                    std::int64_t);                                                \
  template void rope_forward<S>(S*, std::int64_t, std::int64_t, std::int64_t, std::int64_t,       \
                                double);                                                          \
  template void rope_backward<S>(S*, std::int64_t, std::int64_t, std::int64_t, std::int64_t,      \
                                 double);                                                         \
  template void attention_forward<S>(S*, S*, const S*, const S*, const S*, std::int64_t,          \
                                     std::int64_t, std::int64_t, std::int64_t, std::int64_t);     \
  template void attention_backward<S>(S*, S*, S*, S*, const S*, const S*, const S*, const S*,     \
                                      const S*, std::int64_t, std::int64_t, std::int64_t,         \
                                      std::int64_t, std::int64_t);                                \
  template void gelu_forward<S>(S*, const S*, std::int64_t);                                      \
  template void gelu_backward<S>(S*, const S*, const S*, std::int64_t);                           \
  template void swiglu_forward<S>(S*, const S*, const S*, std::int64_t);                          \
  template void swiglu_backward<S>(S*, S*, const S*, const S*, const S*, std::int64_t);           \
  template void log_softmax_forward<S>(S*, const S*, std::int64_t, std::int64_t);                 \
  template double nll_loss_forward<S>(const S*, const std::int32_t*, std::int64_t, std::int64_t); \
  template void nll_loss_backward<S>(S*, const std::int32_t*, std::int64_t, std::int64_t, S);     \
  template void log_softmax_backward<S>(S*, const S*, const S*, std::int64_t, std::int64_t);

SHARDPLAN_INSTANTIATE_KERNELS(float)
SHARDPLAN_INSTANTIATE_KERNELS(double)
#undef SHARDPLAN_INSTANTIATE_KERNELS

}  // namespace shardplan::executor::kernels
