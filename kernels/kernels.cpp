#include "kernels/kernels.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include <bit>
#include <type_traits>

#include <Eigen/Core>

namespace shardplan::kernels {
namespace {

template <class S>
using RowMajor = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class S> using MatrixMap = Eigen::Map<RowMajor<S>>;
template <class S> using ConstMatrixMap = Eigen::Map<const RowMajor<S>>;
template <class S> using RowVectorMap = Eigen::Map<Eigen::Matrix<S, 1, Eigen::Dynamic>>;
template <class S> using ArrayMap = Eigen::Map<Eigen::Array<S, 1, Eigen::Dynamic>>;
template <class S> using ConstArrayMap = Eigen::Map<const Eigen::Array<S, 1, Eigen::Dynamic>>;
// exp(x) for the kernels' element-wise loops. fp32: Cephes' expf (Moshier 1984, cephes/single/
// expf.c): x = n·ln2 + r with |r| ≤ ln2/2, exp(r) by its degree-5 minimax polynomial, times 2ⁿ
// built in the exponent bits; no calls, so the loops that use it are vectorised (with
// -fno-trapping-math, see CMakeLists.txt; libm's expf is a call per element: ~5 ns against ~1 ns),
// relative error ≤ 1e-7 (1 ulp) on [−87, 88], inputs clamped to that range (exp(−87) ≈ 1.6e-38 is
// the smallest normal float's order; a softmax never needs less). fp64 (the gradient check):
// std::exp.
template <class S> inline S exp_fast(S x) {
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

template <class S> using ConstRowVectorMap = Eigen::Map<const Eigen::Matrix<S, 1, Eigen::Dynamic>>;

// Element types (scalar.hpp). A kernel reads S through widen(), computes and sums in
// A = accum_t<S>, and rounds once, through narrow<S>(), where it writes an S element (a backward
// kernel: out = narrow(widen(out) + Σ terms)). For fp32 and fp64, where both are the identity, the
// kernels are Eigen's GEMMs and loops that sum in the output itself (a weight gradient over the
// rows, an embedding row over its tokens); there the 16-bit types have loops of their own, which
// sum in fp32 and round once, element by element. The 16-bit linear layers run Eigen's GEMM on
// fp32 copies of their operands (the one place a kernel allocates: untracked heap, like Eigen's
// packing buffers); the other loops need no scratch and are fast enough for the tests' models.

// The largest element of a row of S, in accum_t<S>.
template <class S> accum_t<S> row_max(const S* z, std::int64_t n) {
  if constexpr (is_half_v<S>) {
    accum_t<S> m = widen(z[0]);
    for (std::int64_t j = 1; j < n; ++j) m = std::max(m, widen(z[j]));
    return m;
  } else {
    return ConstArrayMap<S>(z, n).maxCoeff();
  }
}

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
        for (std::int64_t c = 0; c < channels; ++c) o[c] = narrow<S>(widen(o[c]) + widen(p[c]));
      }
    }
}

template <class S>
void embedding_backward(S* dwte, S* dwpe, const S* dout, const std::int32_t* tokens,
                        std::int64_t batch, std::int64_t seq, std::int64_t channels) {
  if constexpr (is_half_v<S>) {
    // A wte row gets the sum over the tokens equal to it, a wpe row the sum over the batch, each
    // in fp32 in token order and rounded once. A token's first occurrence sums all of them.
    const std::int64_t n_tokens = batch * seq;
    for (std::int64_t n = 0; n < n_tokens; ++n) {
      if (std::find(tokens, tokens + n, tokens[n]) != tokens + n) continue;
      S* e = dwte + static_cast<std::int64_t>(tokens[n]) * channels;
      for (std::int64_t c = 0; c < channels; ++c) {
        accum_t<S> sum = widen(e[c]);
        for (std::int64_t m = n; m < n_tokens; ++m)
          if (tokens[m] == tokens[n]) sum += widen(dout[m * channels + c]);
        e[c] = narrow<S>(sum);
      }
    }
    if (dwpe)
      for (std::int64_t t = 0; t < seq; ++t)
        for (std::int64_t c = 0; c < channels; ++c) {
          S* p = dwpe + t * channels + c;
          accum_t<S> sum = widen(*p);
          for (std::int64_t b = 0; b < batch; ++b) sum += widen(dout[(b * seq + t) * channels + c]);
          *p = narrow<S>(sum);
        }
  } else {
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
}

namespace {

// A 16-bit matrix widened into fp32, for Eigen's GEMM. The copy is heap memory outside the
// tracked allocator, like Eigen's own packing buffers (tracked_allocator.hpp).
template <class S> RowMajor<float> widened(const S* a, std::int64_t rows, std::int64_t cols) {
  RowMajor<float> m(rows, cols);
  float* out = m.data();
  for (std::int64_t i = 0; i < rows * cols; ++i) out[i] = widen(a[i]);
  return m;
}

// out = narrow(out + Σ) element by element: a 16-bit output that gets an fp32 sum, rounded once.
template <class S> void add_rounded(S* out, const RowMajor<float>& sum) {
  const float* s = sum.data();
  for (std::int64_t i = 0; i < sum.size(); ++i) out[i] = narrow<S>(widen(out[i]) + s[i]);
}

}  // namespace

template <class S>
void linear_forward(S* y, const S* x, const S* w, const S* b, std::int64_t n, std::int64_t in,
                    std::int64_t out, bool accumulate) {
  if constexpr (is_half_v<S>) {
    // y = narrow((y +) x·wᵀ (+ b)): the GEMM on fp32 copies of the operands, the sum in fp32
    // (cuBLAS's CUBLAS_COMPUTE_32F; accumulate: β = 1), one rounding.
    RowMajor<float> Y = widened(x, n, in) * widened(w, out, in).transpose();
    if (b)
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t o = 0; o < out; ++o) Y(i, o) += widen(b[o]);
    if (accumulate) {
      add_rounded(y, Y);
    } else {
      const float* v = Y.data();
      for (std::int64_t i = 0; i < n * out; ++i) y[i] = narrow<S>(v[i]);
    }
  } else {
    MatrixMap<S> Y(y, n, out);
    ConstMatrixMap<S> X(x, n, in);
    ConstMatrixMap<S> W(w, out, in);
    if (accumulate)
      Y.noalias() += X * W.transpose();
    else
      Y.noalias() = X * W.transpose();
    if (b) Y.rowwise() += ConstRowVectorMap<S>(b, out);
  }
}

template <class S>
void linear_backward(S* dx, S* dw, S* db, const S* dy, const S* x, const S* w, std::int64_t n,
                     std::int64_t in, std::int64_t out) {
  if constexpr (is_half_v<S>) {
    // Each gradient: its GEMM on fp32 copies, added to the old value, one rounding.
    const RowMajor<float> dY = widened(dy, n, out);
    if (dx) add_rounded(dx, RowMajor<float>(dY * widened(w, out, in)));
    add_rounded(dw, RowMajor<float>(dY.transpose() * widened(x, n, in)));
    if (db) add_rounded(db, RowMajor<float>(dY.colwise().sum()));
  } else {
    ConstMatrixMap<S> dY(dy, n, out);
    if (dx) MatrixMap<S>(dx, n, in).noalias() += dY * ConstMatrixMap<S>(w, out, in);
    MatrixMap<S>(dw, out, in).noalias() += dY.transpose() * ConstMatrixMap<S>(x, n, in);
    if (db) RowVectorMap<S>(db, out) += dY.colwise().sum();
  }
}

template <class S>
void layernorm_forward(S* y, accum_t<S>* mean, accum_t<S>* rstd, const S* x, const S* w, const S* b,
                       std::int64_t n, std::int64_t channels, accum_t<S> eps) {
  using A = accum_t<S>;
  const A inv_c = A(1) / static_cast<A>(channels);
  for (std::int64_t i = 0; i < n; ++i) {
    const S* xi = x + i * channels;
    A m = 0;
    for (std::int64_t c = 0; c < channels; ++c) m += widen(xi[c]);
    m *= inv_c;
    A var = 0;
    for (std::int64_t c = 0; c < channels; ++c) var += (widen(xi[c]) - m) * (widen(xi[c]) - m);
    var *= inv_c;
    const A r = A(1) / std::sqrt(var + eps);
    S* yi = y + i * channels;
    for (std::int64_t c = 0; c < channels; ++c)
      yi[c] = narrow<S>((widen(xi[c]) - m) * r * widen(w[c]) + widen(b[c]));
    mean[i] = m;
    rstd[i] = r;
  }
}

template <class S>
void layernorm_backward(S* dx, S* dw, S* db, const S* dy, const S* x, const S* w,
                        const accum_t<S>* mean, const accum_t<S>* rstd, std::int64_t n,
                        std::int64_t channels) {
  using A = accum_t<S>;
  const A inv_c = A(1) / static_cast<A>(channels);
  for (std::int64_t i = 0; i < n; ++i) {
    const S* dyi = dy + i * channels;
    const S* xi = x + i * channels;
    const A m = mean[i], r = rstd[i];
    A g_mean = 0, gx_mean = 0;
    for (std::int64_t c = 0; c < channels; ++c) {
      const A xhat = (widen(xi[c]) - m) * r;
      const A g = widen(dyi[c]) * widen(w[c]);
      g_mean += g;
      gx_mean += g * xhat;
    }
    g_mean *= inv_c;
    gx_mean *= inv_c;
    S* dxi = dx + i * channels;
    for (std::int64_t c = 0; c < channels; ++c) {
      const A xhat = (widen(xi[c]) - m) * r;
      const A g = widen(dyi[c]) * widen(w[c]);
      dxi[c] = narrow<S>(widen(dxi[c]) + r * (g - g_mean - xhat * gx_mean));
      if constexpr (!is_half_v<S>) {
        dw[c] += dyi[c] * xhat;
        db[c] += dyi[c];
      }
    }
  }
  if constexpr (is_half_v<S>) {
    // dw, db: the sums over the rows in fp32, in row order, one rounding.
    for (std::int64_t c = 0; c < channels; ++c) {
      A sum_w = widen(dw[c]), sum_b = widen(db[c]);
      for (std::int64_t i = 0; i < n; ++i) {
        const A d = widen(dy[i * channels + c]);
        sum_w += d * ((widen(x[i * channels + c]) - mean[i]) * rstd[i]);
        sum_b += d;
      }
      dw[c] = narrow<S>(sum_w);
      db[c] = narrow<S>(sum_b);
    }
  }
}

template <class S>
void rmsnorm_forward(S* y, accum_t<S>* rstd, const S* x, const S* w, std::int64_t n,
                     std::int64_t channels, accum_t<S> eps) {
  using A = accum_t<S>;
  const A inv_c = A(1) / static_cast<A>(channels);
  for (std::int64_t i = 0; i < n; ++i) {
    const S* xi = x + i * channels;
    A ms = 0;
    for (std::int64_t c = 0; c < channels; ++c) ms += widen(xi[c]) * widen(xi[c]);
    const A r = A(1) / std::sqrt(ms * inv_c + eps);
    S* yi = y + i * channels;
    for (std::int64_t c = 0; c < channels; ++c) yi[c] = narrow<S>(widen(xi[c]) * r * widen(w[c]));
    rstd[i] = r;
  }
}

template <class S>
void rmsnorm_backward(S* dx, S* dw, const S* dy, const S* x, const S* w, const accum_t<S>* rstd,
                      std::int64_t n, std::int64_t channels) {
  using A = accum_t<S>;
  const A inv_c = A(1) / static_cast<A>(channels);
  for (std::int64_t i = 0; i < n; ++i) {
    const S* dyi = dy + i * channels;
    const S* xi = x + i * channels;
    const A r = rstd[i];
    A gx_mean = 0;
    for (std::int64_t c = 0; c < channels; ++c)
      gx_mean += widen(dyi[c]) * widen(w[c]) * widen(xi[c]) * r;
    gx_mean *= inv_c;
    S* dxi = dx + i * channels;
    for (std::int64_t c = 0; c < channels; ++c) {
      const A xhat = widen(xi[c]) * r;
      dxi[c] = narrow<S>(widen(dxi[c]) + r * (widen(dyi[c]) * widen(w[c]) - xhat * gx_mean));
      if constexpr (!is_half_v<S>) dw[c] += dyi[c] * xhat;
    }
  }
  if constexpr (is_half_v<S>) {
    // dw: the sum over the rows in fp32, in row order, one rounding.
    for (std::int64_t c = 0; c < channels; ++c) {
      A sum = widen(dw[c]);
      for (std::int64_t i = 0; i < n; ++i)
        sum += widen(dy[i * channels + c]) * (widen(x[i * channels + c]) * rstd[i]);
      dw[c] = narrow<S>(sum);
    }
  }
}

namespace {

// Rotates every (i, i + d/2) channel pair of every head by ±angle(t, i).
template <class S>
void rotate_pairs(S* x, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                  std::int64_t head_dim, double theta, double direction,
                  const std::int32_t* positions) {
  using A = accum_t<S>;
  const std::int64_t half = head_dim / 2;
  for (std::int64_t t = 0; t < seq; ++t)
    for (std::int64_t i = 0; i < half; ++i) {
      // inv_freq_i = θ^(−2i/d) (HF LlamaRotaryEmbedding), angle in double for every scalar type.
      const double inv_freq =
          std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
      const double angle = static_cast<double>(positions ? positions[t] : t) * inv_freq;
      const A c = static_cast<A>(std::cos(angle));
      const A s = static_cast<A>(direction * std::sin(angle));
      for (std::int64_t b = 0; b < batch; ++b)
        for (std::int64_t h = 0; h < heads; ++h) {
          S* p = x + ((b * seq + t) * heads + h) * head_dim;
          const A x1 = widen(p[i]), x2 = widen(p[i + half]);
          p[i] = narrow<S>(x1 * c - x2 * s);
          p[i + half] = narrow<S>(x2 * c + x1 * s);
        }
    }
}

}  // namespace

template <class S>
void rope_forward(S* x, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                  std::int64_t head_dim, double theta, const std::int32_t* positions) {
  rotate_pairs(x, batch, seq, heads, head_dim, theta, 1.0, positions);
}

// The rotation is orthogonal, so the gradient w.r.t. its input is Rᵀ·dy = R(−angle)·dy.
template <class S>
void rope_backward(S* dx, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                   std::int64_t head_dim, double theta, const std::int32_t* positions) {
  rotate_pairs(dx, batch, seq, heads, head_dim, theta, -1.0, positions);
}

namespace {

// The 16-bit types' attention, one (sequence, head) at a time on rows of stride `qs` (q, out,
// dout) and `ks` (k, v): the same formulas as the Eigen code below, every sum in fp32. The
// probabilities and dS are S tensors, as a 16-bit GEMM reads them: the output is P·V of the
// stored (rounded) P, the backward's dQ and dK sums of the stored dS. A score row is computed
// again for each pass over it instead of being kept in fp32 (the kernels allocate nothing).
template <class S> accum_t<S> dot_rows(const S* a, const S* b, std::int64_t d) {
  accum_t<S> sum = 0;
  for (std::int64_t e = 0; e < d; ++e) sum += widen(a[e]) * widen(b[e]);
  return sum;
}

template <class S>
void attention_forward_head(S* o, S* p, const S* q, const S* k, const S* v, std::int64_t seq,
                            std::int64_t qs, std::int64_t ks, std::int64_t d, accum_t<S> scale) {
  using A = accum_t<S>;
  for (std::int64_t t = 0; t < seq; ++t) {
    const S* qt = q + t * qs;
    S* row = p + t * seq;
    A maxv = dot_rows(qt, k, d);
    for (std::int64_t j = 1; j <= t; ++j) maxv = std::max(maxv, dot_rows(qt, k + j * ks, d));
    maxv *= scale;
    A sum = 0;
    for (std::int64_t j = 0; j <= t; ++j)
      sum += exp_fast(dot_rows(qt, k + j * ks, d) * scale - maxv);
    const A inv = A(1) / sum;
    for (std::int64_t j = 0; j <= t; ++j)
      row[j] = narrow<S>(exp_fast(dot_rows(qt, k + j * ks, d) * scale - maxv) * inv);
    std::fill(row + t + 1, row + seq, S{});
    for (std::int64_t e = 0; e < d; ++e) {
      A sum_pv = 0;
      for (std::int64_t j = 0; j <= t; ++j) sum_pv += widen(row[j]) * widen(v[j * ks + e]);
      o[t * qs + e] = narrow<S>(sum_pv);
    }
  }
}

template <class S>
void attention_backward_head(S* dq, S* dk, S* dv, S* ds, const S* dout, const S* p, const S* q,
                             const S* k, const S* v, std::int64_t seq, std::int64_t qs,
                             std::int64_t ks, std::int64_t d, accum_t<S> scale) {
  using A = accum_t<S>;
  // dV[j] += Σₜ P[t, j]·dO[t].
  for (std::int64_t j = 0; j < seq; ++j)
    for (std::int64_t e = 0; e < d; ++e) {
      A sum = 0;
      for (std::int64_t t = j; t < seq; ++t) sum += widen(p[t * seq + j]) * widen(dout[t * qs + e]);
      dv[j * ks + e] = narrow<S>(widen(dv[j * ks + e]) + sum);
    }
  // dS[t, j] = P[t, j]·(dP[t, j] − Σⱼ P·dP)·scale, dP[t, j] = dO[t]·V[j].
  for (std::int64_t t = 0; t < seq; ++t) {
    const S* prow = p + t * seq;
    const S* dout_t = dout + t * qs;
    A dot = 0;
    for (std::int64_t j = 0; j <= t; ++j) dot += widen(prow[j]) * dot_rows(dout_t, v + j * ks, d);
    S* drow = ds + t * seq;
    for (std::int64_t j = 0; j <= t; ++j)
      drow[j] = narrow<S>(widen(prow[j]) * (dot_rows(dout_t, v + j * ks, d) - dot) * scale);
    std::fill(drow + t + 1, drow + seq, S{});
  }
  // dQ[t] += Σⱼ dS[t, j]·K[j];  dK[j] += Σₜ dS[t, j]·Q[t].
  for (std::int64_t t = 0; t < seq; ++t)
    for (std::int64_t e = 0; e < d; ++e) {
      A sum = 0;
      for (std::int64_t j = 0; j <= t; ++j) sum += widen(ds[t * seq + j]) * widen(k[j * ks + e]);
      dq[t * qs + e] = narrow<S>(widen(dq[t * qs + e]) + sum);
    }
  for (std::int64_t j = 0; j < seq; ++j)
    for (std::int64_t e = 0; e < d; ++e) {
      A sum = 0;
      for (std::int64_t t = j; t < seq; ++t) sum += widen(ds[t * seq + j]) * widen(q[t * qs + e]);
      dk[j * ks + e] = narrow<S>(widen(dk[j * ks + e]) + sum);
    }
}

}  // namespace

template <class S>
void attention_forward(S* out, S* probs, const S* q, const S* k, const S* v, std::int64_t batch,
                       std::int64_t seq, std::int64_t heads, std::int64_t kv_heads,
                       std::int64_t head_dim) {
  const std::int64_t group = heads / kv_heads;
  if constexpr (is_half_v<S>) {
    const auto scale = static_cast<accum_t<S>>(1.0 / std::sqrt(static_cast<double>(head_dim)));
    const std::int64_t qs = heads * head_dim, ks = kv_heads * head_dim;
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t h = 0; h < heads; ++h) {
        const std::int64_t qo = b * seq * qs + h * head_dim;
        const std::int64_t ko = b * seq * ks + h / group * head_dim;
        attention_forward_head(out + qo, probs + (b * heads + h) * seq * seq, q + qo, k + ko,
                               v + ko, seq, qs, ks, head_dim, scale);
      }
  } else {
    const std::int64_t n = batch * seq;
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
}

template <class S>
void attention_backward(S* dq, S* dk, S* dv, S* scratch, const S* dout, const S* probs, const S* q,
                        const S* k, const S* v, std::int64_t batch, std::int64_t seq,
                        std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim) {
  const std::int64_t group = heads / kv_heads;
  if constexpr (is_half_v<S>) {
    // A key/value head's gradients are rounded once per query head of its group.
    const auto scale = static_cast<accum_t<S>>(1.0 / std::sqrt(static_cast<double>(head_dim)));
    const std::int64_t qs = heads * head_dim, ks = kv_heads * head_dim;
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t h = 0; h < heads; ++h) {
        const std::int64_t qo = b * seq * qs + h * head_dim;
        const std::int64_t ko = b * seq * ks + h / group * head_dim;
        attention_backward_head(dq + qo, dk + ko, dv + ko, scratch, dout + qo,
                                probs + (b * heads + h) * seq * seq, q + qo, k + ko, v + ko, seq,
                                qs, ks, head_dim, scale);
      }
  } else {
    const std::int64_t n = batch * seq;
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
}

namespace {
template <class S> constexpr S kGeluScale = static_cast<S>(0.7978845608028654);  // √(2/π)
template <class S> constexpr S kGeluCubic = static_cast<S>(0.044715);
}  // namespace

template <class S> void gelu_forward(S* out, const S* in, std::int64_t n) {
  using A = accum_t<S>;
  for (std::int64_t i = 0; i < n; ++i) {
    const A x = widen(in[i]);
    out[i] =
        narrow<S>(A(0.5) * x * (A(1) + std::tanh(kGeluScale<A> * (x + kGeluCubic<A> * x * x * x))));
  }
}

template <class S> void gelu_backward(S* din, const S* in, const S* dout, std::int64_t n) {
  using A = accum_t<S>;
  for (std::int64_t i = 0; i < n; ++i) {
    const A x = widen(in[i]);
    const A th = std::tanh(kGeluScale<A> * (x + kGeluCubic<A> * x * x * x));
    const A sech2 = A(1) - th * th;
    const A local = A(0.5) * (A(1) + th) +
                    A(0.5) * x * sech2 * kGeluScale<A> * (A(1) + A(3) * kGeluCubic<A> * x * x);
    din[i] = narrow<S>(widen(din[i]) + local * widen(dout[i]));
  }
}

template <class S> void swiglu_forward(S* out, const S* gate, const S* up, std::int64_t n) {
  using A = accum_t<S>;
  for (std::int64_t i = 0; i < n; ++i) {
    const A g = widen(gate[i]);
    const A sig = A(1) / (A(1) + exp_fast(-g));
    out[i] = narrow<S>(g * sig * widen(up[i]));
  }
}

template <class S>
void swiglu_backward(S* dgate, S* dup, const S* dout, const S* gate, const S* up, std::int64_t n) {
  using A = accum_t<S>;
  for (std::int64_t i = 0; i < n; ++i) {
    const A g = widen(gate[i]);
    const A sig = A(1) / (A(1) + exp_fast(-g));
    const A d = widen(dout[i]);
    dgate[i] = narrow<S>(widen(dgate[i]) + d * widen(up[i]) * sig * (A(1) + g * (A(1) - sig)));
    dup[i] = narrow<S>(widen(dup[i]) + d * g * sig);
  }
}

template <class S>
void log_softmax_forward(accum_t<S>* logp, const S* logits, std::int64_t n, std::int64_t vocab) {
  using A = accum_t<S>;
  for (std::int64_t i = 0; i < n; ++i) {
    const S* zi = logits + i * vocab;
    A* out = logp + i * vocab;  // holds exp(z − max) first
    const A maxv = row_max(zi, vocab);
    for (std::int64_t j = 0; j < vocab; ++j) out[j] = exp_fast(widen(zi[j]) - maxv);
    const A shift = maxv + std::log(ArrayMap<A>(out, vocab).sum());
    for (std::int64_t j = 0; j < vocab; ++j) out[j] = widen(zi[j]) - shift;
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
void nll_loss_backward(accum_t<S>* dlogp, const std::int32_t* targets, std::int64_t n,
                       std::int64_t vocab, accum_t<S> scale) {
  for (std::int64_t i = 0; i < n; ++i) dlogp[i * vocab + targets[i]] -= scale;
}

template <class S>
void log_softmax_backward(S* dlogits, const accum_t<S>* dlogp, const accum_t<S>* logp,
                          std::int64_t n, std::int64_t vocab) {
  using A = accum_t<S>;
  for (std::int64_t i = 0; i < n; ++i) {
    const A* g = dlogp + i * vocab;
    const A* lp = logp + i * vocab;
    S* out = dlogits + i * vocab;
    const A sum = ConstArrayMap<A>(g, vocab).sum();
    for (std::int64_t j = 0; j < vocab; ++j) out[j] = narrow<S>(g[j] - exp_fast(lp[j]) * sum);
  }
}

template <class S>
void vocab_embedding_forward(S* out, const std::int32_t* tokens, const S* wte, const S* wpe,
                             std::int64_t begin, std::int64_t rows, std::int64_t batch,
                             std::int64_t seq, std::int64_t channels) {
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t t = 0; t < seq; ++t) {
      const std::int64_t n = b * seq + t;
      S* o = out + n * channels;
      const std::int64_t row = static_cast<std::int64_t>(tokens[n]) - begin;
      if (row >= 0 && row < rows)
        std::copy_n(wte + row * channels, channels, o);
      else
        std::fill_n(o, channels, S{});
      if (wpe) {
        const S* p = wpe + t * channels;
        for (std::int64_t c = 0; c < channels; ++c) o[c] = narrow<S>(widen(o[c]) + widen(p[c]));
      }
    }
}

template <class S>
void vocab_embedding_backward(S* dwte, S* dwpe, const S* dout, const std::int32_t* tokens,
                              std::int64_t begin, std::int64_t rows, std::int64_t batch,
                              std::int64_t seq, std::int64_t channels) {
  const std::int64_t n_tokens = batch * seq;
  auto mine = [&](std::int64_t n) {
    const std::int64_t row = static_cast<std::int64_t>(tokens[n]) - begin;
    return row >= 0 && row < rows;
  };
  for (std::int64_t n = 0; n < n_tokens; ++n) {
    if (!mine(n)) continue;
    S* e = dwte + (static_cast<std::int64_t>(tokens[n]) - begin) * channels;
    if constexpr (is_half_v<S>) {
      // As embedding_backward: a row's tokens summed in fp32 in token order, rounded once.
      if (std::find(tokens, tokens + n, tokens[n]) != tokens + n) continue;
      for (std::int64_t c = 0; c < channels; ++c) {
        accum_t<S> sum = widen(e[c]);
        for (std::int64_t m = n; m < n_tokens; ++m)
          if (tokens[m] == tokens[n]) sum += widen(dout[m * channels + c]);
        e[c] = narrow<S>(sum);
      }
    } else {
      const S* d = dout + n * channels;
      for (std::int64_t c = 0; c < channels; ++c) e[c] += d[c];
    }
  }
  if (!dwpe) return;
  for (std::int64_t t = 0; t < seq; ++t)
    for (std::int64_t c = 0; c < channels; ++c) {
      S* p = dwpe + t * channels + c;
      accum_t<S> sum = widen(*p);
      for (std::int64_t b = 0; b < batch; ++b) sum += widen(dout[(b * seq + t) * channels + c]);
      *p = narrow<S>(sum);
    }
}

template <class S>
void logits_row_max(accum_t<S>* max, const S* logits, std::int64_t n, std::int64_t vocab) {
  for (std::int64_t i = 0; i < n; ++i) max[i] = row_max(logits + i * vocab, vocab);
}

template <class S>
void logits_row_sum_exp(accum_t<S>* sum, const S* logits, const accum_t<S>* max, std::int64_t n,
                        std::int64_t vocab) {
  using A = accum_t<S>;
  for (std::int64_t i = 0; i < n; ++i) {
    const S* zi = logits + i * vocab;
    A s = 0;
    for (std::int64_t j = 0; j < vocab; ++j) s += exp_fast(widen(zi[j]) - max[i]);
    sum[i] = s;
  }
}

template <class S>
void log_softmax_from_stats(accum_t<S>* logp, const S* logits, const accum_t<S>* max,
                            const accum_t<S>* sum, std::int64_t n, std::int64_t vocab) {
  using A = accum_t<S>;
  for (std::int64_t i = 0; i < n; ++i) {
    const A shift = max[i] + std::log(sum[i]);
    for (std::int64_t j = 0; j < vocab; ++j)
      logp[i * vocab + j] = widen(logits[i * vocab + j]) - shift;
  }
}

template <class S>
double vocab_nll_loss_forward(const accum_t<S>* logp, const std::int32_t* targets,
                              std::int64_t begin, std::int64_t n, std::int64_t vocab) {
  double sum = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t j = static_cast<std::int64_t>(targets[i]) - begin;
    if (j >= 0 && j < vocab) sum -= static_cast<double>(logp[i * vocab + j]);
  }
  return sum;
}

template <class S>
void vocab_cross_entropy_backward(S* dlogits, const accum_t<S>* logp, const std::int32_t* targets,
                                  std::int64_t begin, std::int64_t n, std::int64_t vocab,
                                  accum_t<S> scale) {
  using A = accum_t<S>;
  for (std::int64_t i = 0; i < n; ++i) {
    const A* lp = logp + i * vocab;
    S* out = dlogits + i * vocab;
    const std::int64_t target = static_cast<std::int64_t>(targets[i]) - begin;
    for (std::int64_t j = 0; j < vocab; ++j) {
      const A p = exp_fast(lp[j]) * scale;
      out[j] = narrow<S>(j == target ? p - scale : p);
    }
  }
}

// S is a type: bugprone-macro-parentheses asks for "(S)*", which is not a type.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define SHARDPLAN_INSTANTIATE_KERNELS(S)                                                           \
  template void embedding_forward<S>(S*, const std::int32_t*, const S*, const S*, std::int64_t,    \
                                     std::int64_t, std::int64_t);                                  \
  template void embedding_backward<S>(S*, S*, const S*, const std::int32_t*, std::int64_t,         \
                                      std::int64_t, std::int64_t);                                 \
  template void linear_forward<S>(S*, const S*, const S*, const S*, std::int64_t, std::int64_t,    \
                                  std::int64_t, bool);                                             \
  template void linear_backward<S>(S*, S*, S*, const S*, const S*, const S*, std::int64_t,         \
                                   std::int64_t, std::int64_t);                                    \
  template void layernorm_forward<S>(S*, accum_t<S>*, accum_t<S>*, const S*, const S*, const S*,   \
                                     std::int64_t, std::int64_t, accum_t<S>);                      \
  template void layernorm_backward<S>(S*, S*, S*, const S*, const S*, const S*, const accum_t<S>*, \
                                      const accum_t<S>*, std::int64_t, std::int64_t);              \
  template void rmsnorm_forward<S>(S*, accum_t<S>*, const S*, const S*, std::int64_t,              \
                                   std::int64_t, accum_t<S>);                                      \
  template void rmsnorm_backward<S>(S*, S*, const S*, const S*, const S*, const accum_t<S>*,       \
                                    std::int64_t, std::int64_t);                                   \
  template void rope_forward<S>(S*, std::int64_t, std::int64_t, std::int64_t, std::int64_t,        \
                                double, const std::int32_t*);                                      \
  template void rope_backward<S>(S*, std::int64_t, std::int64_t, std::int64_t, std::int64_t,       \
                                 double, const std::int32_t*);                                     \
  template void attention_forward<S>(S*, S*, const S*, const S*, const S*, std::int64_t,           \
                                     std::int64_t, std::int64_t, std::int64_t, std::int64_t);      \
  template void attention_backward<S>(S*, S*, S*, S*, const S*, const S*, const S*, const S*,      \
                                      const S*, std::int64_t, std::int64_t, std::int64_t,          \
                                      std::int64_t, std::int64_t);                                 \
  template void gelu_forward<S>(S*, const S*, std::int64_t);                                       \
  template void gelu_backward<S>(S*, const S*, const S*, std::int64_t);                            \
  template void swiglu_forward<S>(S*, const S*, const S*, std::int64_t);                           \
  template void swiglu_backward<S>(S*, S*, const S*, const S*, const S*, std::int64_t);            \
  template void log_softmax_forward<S>(accum_t<S>*, const S*, std::int64_t, std::int64_t);         \
  template double nll_loss_forward<S>(const accum_t<S>*, const std::int32_t*, std::int64_t,        \
                                      std::int64_t);                                               \
  template void nll_loss_backward<S>(accum_t<S>*, const std::int32_t*, std::int64_t, std::int64_t, \
                                     accum_t<S>);                                                  \
  template void log_softmax_backward<S>(S*, const accum_t<S>*, const accum_t<S>*, std::int64_t,    \
                                        std::int64_t);                                             \
  template void vocab_embedding_forward<S>(S*, const std::int32_t*, const S*, const S*,            \
                                           std::int64_t, std::int64_t, std::int64_t, std::int64_t, \
                                           std::int64_t);                                          \
  template void vocab_embedding_backward<S>(S*, S*, const S*, const std::int32_t*, std::int64_t,   \
                                            std::int64_t, std::int64_t, std::int64_t,              \
                                            std::int64_t);                                         \
  template void logits_row_max<S>(accum_t<S>*, const S*, std::int64_t, std::int64_t);              \
  template void logits_row_sum_exp<S>(accum_t<S>*, const S*, const accum_t<S>*, std::int64_t,      \
                                      std::int64_t);                                               \
  template void log_softmax_from_stats<S>(accum_t<S>*, const S*, const accum_t<S>*,                \
                                          const accum_t<S>*, std::int64_t, std::int64_t);          \
  template double vocab_nll_loss_forward<S>(const accum_t<S>*, const std::int32_t*, std::int64_t,  \
                                            std::int64_t, std::int64_t);                           \
  template void vocab_cross_entropy_backward<S>(S*, const accum_t<S>*, const std::int32_t*,        \
                                                std::int64_t, std::int64_t, std::int64_t,          \
                                                accum_t<S>);
// NOLINTEND(bugprone-macro-parentheses)

SHARDPLAN_INSTANTIATE_KERNELS(float)
SHARDPLAN_INSTANTIATE_KERNELS(double)
SHARDPLAN_INSTANTIATE_KERNELS(bf16)
SHARDPLAN_INSTANTIATE_KERNELS(f16)
#undef SHARDPLAN_INSTANTIATE_KERNELS

}  // namespace shardplan::kernels
