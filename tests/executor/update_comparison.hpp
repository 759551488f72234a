// Two training runs' parameters compared through what the steps changed: per parameter tensor,
// ‖Δa − Δb‖ / ‖Δb‖ with Δ = p_after − p_before, the relative L2 difference of the updates. The
// bound the MPI equivalence tests put on it (kUpdateTolerance) is derived below.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <fmt/format.h>

#include "executor/model_layout.hpp"

namespace shardplan::executor::testing {

// The bound on ‖Δa − Δb‖ / ‖Δb‖ per parameter tensor for two fp32 runs that take the same
// kSteps = 2 AdamW steps (lr = 1e-2, ε = 1e-8) from the same parameters and sum the same
// gradients in different orders, on d data-parallel × t tensor-parallel ranks, d·t ≤ 8.
// (1) Gradients. A gradient element g = Σ x_i sums N = 16·G·d per-token terms (micro-batches of
//   2 × 8 tokens, G = 2 per rank). The runs add the d·G per-micro-batch partial sums in different
//   trees, and each row-parallel output from t partial products; reordering a sum of n terms
//   changes it by at most (n − 1)·u·Σ|x_i|, u = 2^-24 ≈ 6.0e-8 (Higham, Accuracy and Stability of
//   Numerical Algorithms, §4.2). With n ≤ d·G + t ≤ 17: |δg| ≤ 1e-6·Σ|x_i|. For terms of random
//   sign |g| ≈ Σ|x_i|/√N (√N ≤ 16), so a typical element's relative error is ρ ≤ 1.6e-5 on 8
//   ranks, and ρ shrinks with d·G + t − 1 on fewer.
// (2) AdamW. Step 1 moves an element by lr·g/(|g| + ε), step 2 by lr·m̂/(√v̂ + ε): about lr
//   each, whatever |g| (≫ ε), so ‖Δb‖ ≥ lr·√n_T for a tensor of n_T elements (measured: ≥ 1.15·
//   lr·√n_T on 1 and 8 ranks). The update depends on g/|g|: an element's relative gradient error
//   ρ_i = |δg_i|/|g_i| changes it by lr·min(ρ_i, 2). Near cancellation (|g_i| small beside
//   Σ|x_i|) ρ_i is large, and where |g_i| < |δg_i| the sign flips: 2·lr. Step 2's gradients also
//   see step 1's parameter differences, of the same relative size, so after kSteps the element's
//   change differs by ≈ 2·kSteps·lr·ρ_i.
// (3) Per tensor. A tensor's gradients spread smoothly around 0 (density ≈ 0.4/σ there, σ their
//   spread): ρ_i ≈ ρ·σ/|g_i|, the smallest of n_T values |g_i| is ≈ σ/(0.8·n_T), and the sum
//   over the rest of σ²/g_i² ≈ 0.64·n_T². So ‖Δa − Δb‖ ≈ 2·kSteps·lr·ρ·0.8·n_T and
//     ‖Δa − Δb‖/‖Δb‖ ≈ 3.2·ρ·√n_T.
//   On 8 ranks: 2.0e-4 for a norm's 16 elements (measured worst: 1.4e-4, HSDP, the Llama's
//   input norm), 1.4e-3 for the largest tensors, vocabulary × hidden = 800 elements (measured
//   worst: 9.1e-5, the Llama's lm_head); (1)'s worst case overestimates, rounding errors of
//   random sign grow as √n·u.
//   Bound: 2e-3.
// The largest absolute difference is no such measure: it is set by the one element nearest to
// cancellation or to |g| ≈ ε, where lr·g/(|g| + ε) is steepest, and grows with the number of
// elements and ranks. (The 2e-5 absolute bound this replaces failed on 8 ranks with 3.9e-5, an
// lm_head element whose step-1 gradient was ≈ 1.7e-8.)
// The margin. A wrong result moves whole tensors by ~lr: a missing rank's gradient flips every
// element whose other ranks' sum is smaller than that rank's share, a wrong slice or a missing
// reduction gives another gradient altogether. "engine::the update comparison fails a wrong
// result" measures, on 1–8 ranks, the smallest over the tensors: one rank's micro-batches
// missing ≥ 0.22 (110× the bound), a wrong slice ≥ 0.53, every update 1% too large 1e-2 (5×).
// What it cannot tell from a bug: one element whose gradient cancels to below its rounding
// error, flipping in one run only, adds up to 4·lr/‖Δb‖ (0.12 in an 800-element tensor). The
// chance, ≈ 0.8·ρ·n_T per tensor, is at most 1e-2 for the largest tensors on 8 ranks (3e-3 with
// rounding errors of random sign); the tests' data are fixed (seed 77) and on 1–8 ranks no
// element flips. A failure names the tensor and its worst element with that element's update:
// one element of a large tensor, alone, is such a flip; many elements, or a small tensor, a bug.
inline constexpr double kUpdateTolerance = 2e-3;

// A tensor with no gradient in exact arithmetic: the key's bias without rotary positions (a
// constant added to every key shifts each query's scores by the same amount, which softmax
// ignores). Its fp32 gradient is rounding noise, |g| ≪ ε, which AdamW turns into a step of
// lr·g/(|g| + ε) ≪ lr in a direction of chance: the runs' changes are compared in absolute
// terms, |a − b| ≤ 1e-4 = lr/100 (measured: each run moves it by at most 8.3e-6 and the runs
// differ by at most 8.3e-6 on 1–8 ranks); a real gradient there moves it by ~lr.
inline constexpr double kZeroGradientTolerance = 1e-4;

// A parameter tensor's elements in its unit's flat buffer; a fused query_key_value as its q, k
// and v parts.
struct TensorRange {
  std::string name;
  std::int64_t offset = 0;
  std::int64_t length = 0;
  bool zero_gradient = false;  // no gradient in exact arithmetic (above)
};

inline std::vector<TensorRange> tensor_ranges(const GptLayout& layout, UnitKind kind) {
  const auto& m = layout.spec();
  std::vector<TensorRange> r;
  auto add = [&](const std::string& name, std::int64_t offset, std::int64_t length) {
    if (offset != kAbsent) r.push_back({name, offset, length});
  };
  auto norm = [&](const std::string& name, const NormOffsets& n) {
    add(name + ".weight", n.weight, m.hidden);
    add(name + ".bias", n.bias, m.hidden);
  };
  auto linear = [&](const std::string& name, const LinearOffsets& l) {
    add(name + ".weight", l.weight, l.out * l.in);
    add(name + ".bias", l.bias, l.out);
  };
  switch (kind) {
  case UnitKind::embedding:
    add("tokens", layout.embedding().tokens, m.vocab * m.hidden);
    add("positions", layout.embedding().positions, m.max_positions * m.hidden);
    break;
  case UnitKind::block: {
    const auto& b = layout.block();
    norm("norm1", b.norm1);
    norm("norm2", b.norm2);
    linear("q", b.q);
    linear("k", b.k);
    if (b.k.bias != kAbsent && m.positions != documents::PositionKind::rotary)
      r.back().zero_gradient = true;
    linear("v", b.v);
    linear("o", b.o);
    linear("up", b.up);
    if (b.gate.weight != kAbsent) linear("gate", b.gate);
    linear("down", b.down);
    break;
  }
  case UnitKind::head:
    norm("norm", layout.head().norm);
    add("output", layout.head().output, m.vocab * m.hidden);
    break;
  }
  return r;
}

using UnitParams = std::vector<std::vector<float>>;  // every unit's parameters, whole

// One tensor of the comparison.
struct TensorDifference {
  std::string tensor;  // "unit u name"
  std::int64_t elements = 0;
  bool zero_gradient = false;
  double relative = 0;  // ‖Δa − Δb‖ / ‖Δb‖ (0 when neither moved, ∞ when only a did)
  double max_abs = 0;   // max |a − b| = max |Δa − Δb|
  std::int64_t max_abs_index = 0;
  double max_abs_update = 0;  // Δb there
  // Within its bound: kUpdateTolerance on `relative`, or for a zero-gradient tensor
  // kZeroGradientTolerance on `max_abs`.
  bool agrees() const {
    return zero_gradient ? max_abs <= kZeroGradientTolerance : relative <= kUpdateTolerance;
  }
  std::string describe() const {
    return fmt::format("{} ({} elements{}): ‖Δa − Δb‖/‖Δb‖ = {:.3g}, max |a − b| = {:.3g} at [{}] "
                       "where Δb = {:.3g}",
                       tensor, elements, zero_gradient ? ", no gradient in exact arithmetic" : "",
                       relative, max_abs, max_abs_index, max_abs_update);
  }
};

// a and b after the same steps from `initial`, every unit whole in the layout of `layout`; one
// entry per tensor.
inline std::vector<TensorDifference> compare_updates(const GptLayout& layout,
                                                     const UnitParams& initial, const UnitParams& a,
                                                     const UnitParams& b) {
  std::vector<TensorDifference> out;
  for (std::size_t u = 0; u < b.size(); ++u)
    for (const auto& t : tensor_ranges(layout, layout.unit_kind(static_cast<std::int64_t>(u)))) {
      TensorDifference d;
      d.tensor = fmt::format("unit {} {}", u, t.name);
      d.elements = t.length;
      d.zero_gradient = t.zero_gradient;
      double num = 0, den = 0;
      for (std::int64_t k = t.offset; k < t.offset + t.length; ++k) {
        const auto i = static_cast<std::size_t>(k);
        const auto p0 = static_cast<double>(initial[u][i]);
        const auto pa = static_cast<double>(a[u][i]), pb = static_cast<double>(b[u][i]);
        const double diff = (pa - p0) - (pb - p0);
        num += diff * diff;
        den += (pb - p0) * (pb - p0);
        if (std::abs(pa - pb) > d.max_abs) {
          d.max_abs = std::abs(pa - pb);
          d.max_abs_index = k - t.offset;
          d.max_abs_update = pb - p0;
        }
      }
      d.relative = den > 0 ? std::sqrt(num / den)
                           : (num > 0 ? std::numeric_limits<double>::infinity() : 0.0);
      out.push_back(d);
    }
  return out;
}

// The tensor furthest beyond its bound (by ratio to it), for the check and the failure message.
inline TensorDifference worst_of(const std::vector<TensorDifference>& diffs) {
  TensorDifference worst;
  double worst_ratio = -1;
  for (const auto& d : diffs) {
    const double ratio =
        d.zero_gradient ? d.max_abs / kZeroGradientTolerance : d.relative / kUpdateTolerance;
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      worst = d;
    }
  }
  return worst;
}

// The largest differences over a run's comparisons, for its log line: the losses' relative, and
// of the tensors with a gradient the relative update difference and the absolute parameter one.
struct WorstSeen {
  double loss = 0, update = 0, param = 0;
  std::string update_tensor, param_tensor;
  void add(const std::vector<TensorDifference>& diffs) {
    for (const auto& d : diffs) {
      if (d.zero_gradient) continue;
      if (d.relative > update) {
        update = d.relative;
        update_tensor = d.tensor;
      }
      if (d.max_abs > param) {
        param = d.max_abs;
        param_tensor = d.tensor;
      }
    }
  }
  // Records the comparison and checks that every tensor is within its bound, naming the worst.
  void check(const std::vector<TensorDifference>& diffs) {
    add(diffs);
    const auto worst = worst_of(diffs);
    INFO(worst.describe());
    CHECK(worst.agrees());
  }
  std::string text() const {
    return fmt::format("worst relative loss difference {:.3g}, worst relative update difference "
                       "{:.3g} ({}; bound {}), worst absolute parameter difference {:.3g} ({})",
                       loss, update, update_tensor, kUpdateTolerance, param, param_tensor);
  }
};

}  // namespace shardplan::executor::testing
