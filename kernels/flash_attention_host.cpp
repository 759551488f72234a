#include "kernels/flash_attention_host.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include <Eigen/Dense>
#include <fmt/format.h>

namespace shardplan::kernels::flash_host {
namespace {

template <class A> using Tile = Eigen::Matrix<A, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class A> using Column = Eigen::Matrix<A, Eigen::Dynamic, 1>;

// One head's rows of a [B·T, stride] array: `first` is the head's first element of token 0 of
// the sequence, rows r0 … r0 + rows − 1 of it, head_dim columns.
struct HeadRows {
  std::int64_t first;   // element offset of (token 0 of the sequence, the head's channel 0)
  std::int64_t stride;  // elements per token (heads·d or kv_heads·d)
};

template <class S, class A = accum_t<S>>
void load(Tile<A>& tile, const S* base, HeadRows at, std::int64_t r0, std::int64_t rows,
          std::int64_t d) {
  tile.resize(rows, d);
  for (std::int64_t r = 0; r < rows; ++r) {
    const S* row = base + at.first + (r0 + r) * at.stride;
    for (std::int64_t e = 0; e < d; ++e) tile(r, e) = widen(row[e]);
  }
}

// base[rows] += tile, each element rounded to S once.
template <class S, class A = accum_t<S>>
void add_to(S* base, const Tile<A>& tile, HeadRows at, std::int64_t r0) {
  for (std::int64_t r = 0; r < tile.rows(); ++r) {
    S* row = base + at.first + (r0 + r) * at.stride;
    for (std::int64_t e = 0; e < tile.cols(); ++e) row[e] = narrow<S>(widen(row[e]) + tile(r, e));
  }
}

// Scores of queries q0 … q0 + rows − 1 against keys k0 … k0 + cols − 1, scaled; keys after the
// query are −∞ (the causal mask).
template <class A>
void causal_scores(Tile<A>& s, const Tile<A>& qi, const Tile<A>& kj, A scale, std::int64_t q0,
                   std::int64_t k0) {
  s.noalias() = qi * kj.transpose();
  s *= scale;
  for (std::int64_t r = 0; r < s.rows(); ++r)
    for (std::int64_t c = std::max<std::int64_t>(0, q0 + r + 1 - k0); c < s.cols(); ++c)
      s(r, c) = -std::numeric_limits<A>::infinity();
}

void check_shape(std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim) {
  if (heads < 1 || kv_heads < 1 || heads % kv_heads != 0 || head_dim < 1)
    throw std::invalid_argument(fmt::format(
        "flash attention: heads {} must be a positive multiple of kv_heads {}, head_dim {} > 0",
        heads, kv_heads, head_dim));
}

// One tile of scores s [rows, cols] into the running softmax of its rows (FlashAttention-2
// Algorithm 1): the maximum m, the sum ℓ and the unnormalised output acc, rescaled by
// exp(m_old − m_new). A row whose keys in the tile are all masked is left as it was.
template <class A>
void online_update(Tile<A>& s, Column<A>& m, Column<A>& l, Tile<A>& acc, const Tile<A>& vj) {
  for (std::int64_t r = 0; r < s.rows(); ++r) {
    const A tile_max = s.row(r).maxCoeff();
    if (tile_max == -std::numeric_limits<A>::infinity()) {
      s.row(r).setZero();
      continue;
    }
    const A m_new = std::max(m(r), tile_max);
    const A rescale = std::exp(m(r) - m_new);              // 0 on the first block (m = −∞)
    s.row(r) = (s.row(r).array() - m_new).exp().matrix();  // masked: exp(−∞) = 0
    l(r) = l(r) * rescale + s.row(r).sum();
    acc.row(r) *= rescale;
    m(r) = m_new;
  }
  acc.noalias() += s * vj;
}

// FlashAttention-2 Algorithm 1 for one query block of one (sequence, head): the running maximum
// m, sum l and unnormalised output acc, rescaled by exp(m_old − m_new) at every key block.
template <class S>
void forward_block(S* out, accum_t<S>* lse_row, const S* q, const S* k, const S* v, HeadRows qa,
                   HeadRows ka, std::int64_t q0, std::int64_t rows, std::int64_t d) {
  using A = accum_t<S>;
  const A scale = static_cast<A>(1.0 / std::sqrt(static_cast<double>(d)));
  Tile<A> qi, kj, vj, s, acc = Tile<A>::Zero(rows, d);
  Column<A> m = Column<A>::Constant(rows, -std::numeric_limits<A>::infinity());
  Column<A> l = Column<A>::Zero(rows);
  load(qi, q, qa, q0, rows, d);
  const std::int64_t last_key = q0 + rows - 1;
  for (std::int64_t k0 = 0; k0 <= last_key; k0 += kKeyBlock) {
    const std::int64_t cols = std::min(kKeyBlock, last_key + 1 - k0);
    load(kj, k, ka, k0, cols, d);
    load(vj, v, ka, k0, cols, d);
    causal_scores(s, qi, kj, scale, q0, k0);
    online_update(s, m, l, acc, vj);
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    acc.row(r) /= l(r);
    lse_row[q0 + r] = m(r) + std::log(l(r));
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    S* row = out + qa.first + (q0 + r) * qa.stride;
    for (std::int64_t e = 0; e < d; ++e) row[e] = narrow<S>(acc(r, e));
  }
}

// D[t] = Σ_e dO[t, e]·O[t, e] of one (sequence, head).
template <class S>
void row_deltas(accum_t<S>* delta_row, const S* dout, const S* out, HeadRows qa, std::int64_t seq,
                std::int64_t d) {
  using A = accum_t<S>;
  for (std::int64_t t = 0; t < seq; ++t) {
    const S* o = out + qa.first + t * qa.stride;
    const S* g = dout + qa.first + t * qa.stride;
    A sum = 0;
    for (std::int64_t e = 0; e < d; ++e) sum += widen(o[e]) * widen(g[e]);
    delta_row[t] = sum;
  }
}

// FlashAttention-2 Algorithm 2's work on one tile of scores p [rows, cols] (masked scores in,
// dS out): P = exp(p − lse), dV += Pᵀ·dO, dS = P ∘ (dO·Vᵀ − D), dQ += scale·dS·K,
// dK += scale·dSᵀ·Q. lse_row and delta_row point at the tile's first query row.
template <class A, class DqRows>
void backward_tile(Tile<A>& p, Tile<A>& dp, const Tile<A>& qi, const Tile<A>& doi,
                   const Tile<A>& kj, const Tile<A>& vj, const A* lse_row, const A* delta_row,
                   A scale, DqRows dq_rows, Tile<A>& dkj, Tile<A>& dvj) {
  for (std::int64_t r = 0; r < p.rows(); ++r)
    p.row(r) = (p.row(r).array() - lse_row[r]).exp().matrix();
  dvj.noalias() += p.transpose() * doi;
  dp.noalias() = doi * vj.transpose();
  for (std::int64_t r = 0; r < p.rows(); ++r)
    p.row(r) = p.row(r).cwiseProduct((dp.row(r).array() - delta_row[r]).matrix());
  dq_rows.noalias() += scale * (p * kj);
  dkj.noalias() += scale * (p.transpose() * qi);
}

// FlashAttention-2 Algorithm 2 for one key block of one (sequence, head): every query block that
// reaches it, dK and dV of the block in tiles, dQ into the head's accumulator.
template <class S>
void backward_key_block(S* dk, S* dv, Tile<accum_t<S>>& dq_acc, const S* dout,
                        const accum_t<S>* lse_row, const accum_t<S>* delta_row, const S* q,
                        const S* k, const S* v, HeadRows qa, HeadRows ka, std::int64_t k0,
                        std::int64_t cols, std::int64_t seq, std::int64_t d) {
  using A = accum_t<S>;
  const A scale = static_cast<A>(1.0 / std::sqrt(static_cast<double>(d)));
  Tile<A> kj, vj, qi, doi, p, dp;
  load(kj, k, ka, k0, cols, d);
  load(vj, v, ka, k0, cols, d);
  Tile<A> dkj = Tile<A>::Zero(cols, d), dvj = Tile<A>::Zero(cols, d);
  for (std::int64_t q0 = k0 / kQueryBlock * kQueryBlock; q0 < seq; q0 += kQueryBlock) {
    const std::int64_t rows = std::min(kQueryBlock, seq - q0);
    load(qi, q, qa, q0, rows, d);
    load(doi, dout, qa, q0, rows, d);
    causal_scores(p, qi, kj, scale, q0, k0);
    backward_tile(p, dp, qi, doi, kj, vj, lse_row + q0, delta_row + q0, scale,
                  dq_acc.middleRows(q0, rows), dkj, dvj);
  }
  add_to(dk, dkj, ka, k0);
  add_to(dv, dvj, ka, k0);
}

// Scores of the query rows at query_pos against the keys at key_pos, scaled; a key after its query
// is −∞.
template <class A>
void position_scores(Tile<A>& s, const Tile<A>& qi, const Tile<A>& kj, A scale,
                     const std::int32_t* query_pos, const std::int32_t* key_pos) {
  s.noalias() = qi * kj.transpose();
  s *= scale;
  for (std::int64_t r = 0; r < s.rows(); ++r)
    for (std::int64_t c = 0; c < s.cols(); ++c)
      if (key_pos[c] > query_pos[r]) s(r, c) = -std::numeric_limits<A>::infinity();
}

// Whether some key of a tile is visible to some query row of it.
bool tile_visible(const std::int32_t* query_pos, std::int64_t rows, const std::int32_t* key_pos,
                  std::int64_t cols) {
  return *std::min_element(key_pos, key_pos + cols) <=
         *std::max_element(query_pos, query_pos + rows);
}

// forward_at for one query block of one (sequence, head).
template <class S>
void forward_at_block(accum_t<S>* out_acc, accum_t<S>* lse_row, const S* q, const S* k, const S* v,
                      HeadRows qa, HeadRows ka, const Positions& at, bool first, std::int64_t q0,
                      std::int64_t rows, std::int64_t d) {
  using A = accum_t<S>;
  const A scale = static_cast<A>(1.0 / std::sqrt(static_cast<double>(d)));
  Tile<A> qi, kj, vj, s, acc;
  Column<A> m(rows), l(rows);
  if (first) {
    acc.setZero(rows, d);
    m.setConstant(-std::numeric_limits<A>::infinity());
    l.setZero();
  } else {  // the running state of the keys seen so far: m = lse, ℓ = 1, acc = out
    load(acc, out_acc, qa, q0, rows, d);
    for (std::int64_t r = 0; r < rows; ++r) {
      m(r) = lse_row[q0 + r];
      l(r) = m(r) == -std::numeric_limits<A>::infinity() ? A{0} : A{1};
    }
  }
  load(qi, q, qa, q0, rows, d);
  for (std::int64_t k0 = 0; k0 < at.keys; k0 += kKeyBlock) {
    const std::int64_t cols = std::min(kKeyBlock, at.keys - k0);
    if (!tile_visible(at.query + q0, rows, at.key + k0, cols)) continue;
    load(kj, k, ka, k0, cols, d);
    load(vj, v, ka, k0, cols, d);
    position_scores(s, qi, kj, scale, at.query + q0, at.key + k0);
    online_update(s, m, l, acc, vj);
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    if (l(r) > 0) {
      acc.row(r) /= l(r);
      lse_row[q0 + r] = m(r) + std::log(l(r));
    } else {
      lse_row[q0 + r] = -std::numeric_limits<A>::infinity();
    }
    A* row = out_acc + qa.first + (q0 + r) * qa.stride;
    for (std::int64_t e = 0; e < d; ++e) row[e] = acc(r, e);
  }
}

// backward_at for one key block of one (sequence, head): every query block that sees it.
template <class S>
void backward_at_key_block(S* dk, S* dv, Tile<accum_t<S>>& dq_acc, const S* dout,
                           const accum_t<S>* lse_row, const accum_t<S>* delta_row, const S* q,
                           const S* k, const S* v, HeadRows qa, HeadRows ka, const Positions& at,
                           std::int64_t k0, std::int64_t cols, std::int64_t d) {
  using A = accum_t<S>;
  const A scale = static_cast<A>(1.0 / std::sqrt(static_cast<double>(d)));
  Tile<A> kj, vj, qi, doi, p, dp;
  load(kj, k, ka, k0, cols, d);
  load(vj, v, ka, k0, cols, d);
  Tile<A> dkj = Tile<A>::Zero(cols, d), dvj = Tile<A>::Zero(cols, d);
  for (std::int64_t q0 = 0; q0 < at.queries; q0 += kQueryBlock) {
    const std::int64_t rows = std::min(kQueryBlock, at.queries - q0);
    if (!tile_visible(at.query + q0, rows, at.key + k0, cols)) continue;
    load(qi, q, qa, q0, rows, d);
    load(doi, dout, qa, q0, rows, d);
    position_scores(p, qi, kj, scale, at.query + q0, at.key + k0);
    backward_tile(p, dp, qi, doi, kj, vj, lse_row + q0, delta_row + q0, scale,
                  dq_acc.middleRows(q0, rows), dkj, dvj);
  }
  add_to(dk, dkj, ka, k0);
  add_to(dv, dvj, ka, k0);
}

void check_positions(const Positions& at) {
  if (at.queries < 1 || at.keys < 1 || at.query == nullptr || at.key == nullptr)
    throw std::invalid_argument(
        fmt::format("flash attention: {} queries and {} keys with positions", at.queries, at.keys));
}

}  // namespace

template <class S>
void forward(S* out, accum_t<S>* lse, const S* q, const S* k, const S* v, std::int64_t batch,
             std::int64_t seq, std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim) {
  check_shape(heads, kv_heads, head_dim);
  const std::int64_t group = heads / kv_heads, qs = heads * head_dim, ks = kv_heads * head_dim;
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t h = 0; h < heads; ++h) {
      const HeadRows qa{b * seq * qs + h * head_dim, qs};
      const HeadRows ka{b * seq * ks + h / group * head_dim, ks};
      accum_t<S>* lse_row = lse + (b * heads + h) * seq;
      for (std::int64_t q0 = 0; q0 < seq; q0 += kQueryBlock)
        forward_block(out, lse_row, q, k, v, qa, ka, q0, std::min(kQueryBlock, seq - q0), head_dim);
    }
}

template <class S>
void backward(S* dq, S* dk, S* dv, accum_t<S>* delta, const S* dout, const S* out,
              const accum_t<S>* lse, const S* q, const S* k, const S* v, std::int64_t batch,
              std::int64_t seq, std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim) {
  using A = accum_t<S>;
  check_shape(heads, kv_heads, head_dim);
  const std::int64_t group = heads / kv_heads, qs = heads * head_dim, ks = kv_heads * head_dim;
  Tile<A> dq_acc;  // [T, d]: one head's dQ, summed over the key blocks
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t h = 0; h < heads; ++h) {
      const HeadRows qa{b * seq * qs + h * head_dim, qs};
      const HeadRows ka{b * seq * ks + h / group * head_dim, ks};
      const std::int64_t stat = (b * heads + h) * seq;
      row_deltas(delta + stat, dout, out, qa, seq, head_dim);
      dq_acc.setZero(seq, head_dim);
      for (std::int64_t k0 = 0; k0 < seq; k0 += kKeyBlock)
        backward_key_block(dk, dv, dq_acc, dout, lse + stat, delta + stat, q, k, v, qa, ka, k0,
                           std::min(kKeyBlock, seq - k0), seq, head_dim);
      add_to(dq, dq_acc, qa, 0);
    }
}

template <class S>
void forward_at(accum_t<S>* out_acc, accum_t<S>* lse, const S* q, const S* k, const S* v,
                Positions at, bool first, std::int64_t batch, std::int64_t heads,
                std::int64_t kv_heads, std::int64_t head_dim) {
  check_shape(heads, kv_heads, head_dim);
  check_positions(at);
  const std::int64_t group = heads / kv_heads, qs = heads * head_dim, ks = kv_heads * head_dim;
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t h = 0; h < heads; ++h) {
      const HeadRows qa{b * at.queries * qs + h * head_dim, qs};
      const HeadRows ka{b * at.keys * ks + h / group * head_dim, ks};
      accum_t<S>* lse_row = lse + (b * heads + h) * at.queries;
      for (std::int64_t q0 = 0; q0 < at.queries; q0 += kQueryBlock)
        forward_at_block(out_acc, lse_row, q, k, v, qa, ka, at, first, q0,
                         std::min(kQueryBlock, at.queries - q0), head_dim);
    }
}

template <class S>
void backward_at(S* dq, S* dk, S* dv, accum_t<S>* delta, const S* dout, const S* out,
                 const accum_t<S>* lse, const S* q, const S* k, const S* v, Positions at,
                 std::int64_t batch, std::int64_t heads, std::int64_t kv_heads,
                 std::int64_t head_dim) {
  using A = accum_t<S>;
  check_shape(heads, kv_heads, head_dim);
  check_positions(at);
  const std::int64_t group = heads / kv_heads, qs = heads * head_dim, ks = kv_heads * head_dim;
  Tile<A> dq_acc;  // [queries, d]: one head's dQ over this block of keys
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t h = 0; h < heads; ++h) {
      const HeadRows qa{b * at.queries * qs + h * head_dim, qs};
      const HeadRows ka{b * at.keys * ks + h / group * head_dim, ks};
      const std::int64_t stat = (b * heads + h) * at.queries;
      row_deltas(delta + stat, dout, out, qa, at.queries, head_dim);
      dq_acc.setZero(at.queries, head_dim);
      for (std::int64_t k0 = 0; k0 < at.keys; k0 += kKeyBlock)
        backward_at_key_block(dk, dv, dq_acc, dout, lse + stat, delta + stat, q, k, v, qa, ka, at,
                              k0, std::min(kKeyBlock, at.keys - k0), head_dim);
      add_to(dq, dq_acc, qa, 0);
    }
}

// S is a type: bugprone-macro-parentheses asks for "(S)*", which is not a type.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define SHARDPLAN_FLASH_HOST(S)                                                                    \
  template void forward<S>(S*, accum_t<S>*, const S*, const S*, const S*, std::int64_t,            \
                           std::int64_t, std::int64_t, std::int64_t, std::int64_t);                \
  template void backward<S>(S*, S*, S*, accum_t<S>*, const S*, const S*, const accum_t<S>*,        \
                            const S*, const S*, const S*, std::int64_t, std::int64_t,              \
                            std::int64_t, std::int64_t, std::int64_t);                             \
  template void forward_at<S>(accum_t<S>*, accum_t<S>*, const S*, const S*, const S*, Positions,   \
                              bool, std::int64_t, std::int64_t, std::int64_t, std::int64_t);       \
  template void backward_at<S>(S*, S*, S*, accum_t<S>*, const S*, const S*, const accum_t<S>*,     \
                               const S*, const S*, const S*, Positions, std::int64_t,              \
                               std::int64_t, std::int64_t, std::int64_t);
// NOLINTEND(bugprone-macro-parentheses)
SHARDPLAN_FLASH_HOST(float)
SHARDPLAN_FLASH_HOST(double)
SHARDPLAN_FLASH_HOST(bf16)
SHARDPLAN_FLASH_HOST(f16)
#undef SHARDPLAN_FLASH_HOST

}  // namespace shardplan::kernels::flash_host
