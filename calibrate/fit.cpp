#include "calibrate/fit.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include <Eigen/Dense>

namespace shardplan::calibrate {
namespace {

using documents::CurveSegment;
using documents::MeasuredSample;

constexpr int kLawsonIterations = 30;

double predict(const CurveSegment& s, double size_bytes) {
  return s.latency_s + size_bytes / s.bandwidth_Bps;
}

double relative_error(const CurveSegment& s, const MeasuredSample& m) {
  return std::fabs(predict(s, m.size_bytes) - m.time_s) / m.time_s;
}

// Weighted least squares of a·x ≈ 1 (rows of `a`: [1/t, (size/scale)/t]) with latency x(0) ≥ 0
// and slope x(1) ≥ 0: the unconstrained line, else the best line through the origin, else the
// best constant.
Eigen::Vector2d solve_line(const Eigen::MatrixXd& a, const Eigen::VectorXd& weights,
                           bool has_spread) {
  const Eigen::VectorXd root = weights.cwiseSqrt();
  const Eigen::MatrixXd wa = root.asDiagonal() * a;
  Eigen::Vector2d x(0.0, 0.0);
  if (has_spread) {
    x = wa.colPivHouseholderQr().solve(root);
    if (x(0) >= 0 && x(1) > 0) return x;
    if (x(1) > 0) {
      const double slope = wa.col(1).dot(root) / wa.col(1).squaredNorm();
      if (slope > 0) return {0.0, slope};
    }
  }
  return {wa.col(0).dot(root) / wa.col(0).squaredNorm(), 0.0};
}

// The pieces of one partition of the sorted samples: `ends` holds each piece's end index.
struct Partition {
  std::vector<std::size_t> ends;
  std::vector<CurveSegment> segments;
  std::vector<double> errors;  // per sample, each against its own piece
  double max_error = std::numeric_limits<double>::infinity();
};

// The partition into `pieces` runs of at least `min_points` samples with the smallest largest
// relative error (never splitting between equal sizes). Dynamic programming over the end of the
// last piece: the largest error of a partition is the max over its pieces, so the best partition
// of a prefix extends the best partition of a shorter prefix.
Partition best_partition(std::span<const MeasuredSample> samples, int pieces,
                         std::size_t min_points) {
  const std::size_t n = samples.size();
  constexpr double kNone = std::numeric_limits<double>::infinity();
  auto splittable = [&](std::size_t i) {  // a piece may end just before index i
    return i == n || (i > 0 && i < n && samples[i - 1].size_bytes < samples[i].size_bytes);
  };
  // piece_error[b][e]: largest relative error of one piece fitted to samples [b, e).
  std::vector<std::vector<double>> piece_error(n + 1, std::vector<double>(n + 1, kNone));
  for (std::size_t b = 0; b < n; ++b) {
    if (b > 0 && !splittable(b)) continue;
    for (std::size_t e = b + min_points; e <= n; ++e) {
      if (!splittable(e)) continue;
      const auto piece = samples.subspan(b, e - b);
      const CurveSegment s = fit_segment(piece, 0.0);
      double worst = 0;
      for (const auto& m : piece) worst = std::max(worst, relative_error(s, m));
      piece_error[b][e] = worst;
    }
  }
  // best[k][e]: smallest largest error of k pieces covering [0, e); from[k][e]: start of the last.
  const auto k_max = static_cast<std::size_t>(pieces);
  std::vector<std::vector<double>> best(k_max + 1, std::vector<double>(n + 1, kNone));
  std::vector<std::vector<std::size_t>> from(k_max + 1, std::vector<std::size_t>(n + 1, 0));
  best[0][0] = 0;
  for (std::size_t k = 1; k <= k_max; ++k)
    for (std::size_t e = 1; e <= n; ++e)
      for (std::size_t b = 0; b < e; ++b) {
        if (best[k - 1][b] == kNone || piece_error[b][e] == kNone) continue;
        const double worst = std::max(best[k - 1][b], piece_error[b][e]);
        if (worst < best[k][e]) {
          best[k][e] = worst;
          from[k][e] = b;
        }
      }
  Partition p;
  if (best[k_max][n] == kNone) return p;  // no admissible partition
  for (std::size_t k = k_max, e = n; k > 0; e = from[k][e], --k) p.ends.push_back(e);
  std::reverse(p.ends.begin(), p.ends.end());
  std::size_t begin = 0;
  for (std::size_t end : p.ends) {
    const auto piece = samples.subspan(begin, end - begin);
    p.segments.push_back(fit_segment(piece, 0.0));
    for (const auto& m : piece) p.errors.push_back(relative_error(p.segments.back(), m));
    begin = end;
  }
  p.max_error = best[k_max][n];
  return p;
}

// The fit of a partition with each piece refitted within `error_bound`, its ranges made
// contiguous, and its errors evaluated as the cost model evaluates the curve.
CurveFit refined_fit(const std::vector<MeasuredSample>& samples, const Partition& p,
                     double error_bound) {
  CurveFit fit;
  fit.samples = samples;
  std::size_t begin = 0;
  for (std::size_t end : p.ends) {
    const auto piece = std::span<const MeasuredSample>(samples).subspan(begin, end - begin);
    fit.segments.push_back(fit_segment(piece, error_bound));
    begin = end;
  }
  for (std::size_t k = 1; k < fit.segments.size(); ++k)
    fit.segments[k].min_bytes = fit.segments[k - 1].max_bytes;
  for (const auto& m : fit.samples)
    fit.relative_errors.push_back(std::fabs(fit.time_s(m.size_bytes) - m.time_s) / m.time_s);
  fit.median_rel_error = median(fit.relative_errors);
  fit.max_rel_error = *std::max_element(fit.relative_errors.begin(), fit.relative_errors.end());
  return fit;
}

// Whether `a` serves the goals better than `b`: the smaller worst violation of the two goals (as
// a ratio to its goal), then the smaller sum of both ratios (an outlier that no piece count can
// fit decides the first; the rest of the curve, the second).
bool better_fit(const CurveFit& a, const CurveFit& b, const FitOptions& goals) {
  auto max_ratio = [&](const CurveFit& f) { return f.max_rel_error / goals.max_goal; };
  auto median_ratio = [&](const CurveFit& f) { return f.median_rel_error / goals.median_goal; };
  const double worst_a = std::max({max_ratio(a), median_ratio(a), 1.0});
  const double worst_b = std::max({max_ratio(b), median_ratio(b), 1.0});
  if (std::fabs(worst_a - worst_b) > 1e-9 * worst_b) return worst_a < worst_b;
  return max_ratio(a) + median_ratio(a) < max_ratio(b) + median_ratio(b);
}

}  // namespace

CurveSegment fit_segment(std::span<const MeasuredSample> samples, double error_bound) {
  if (samples.empty()) throw std::invalid_argument("fit_segment: no samples");
  const double scale = std::max(1.0, samples.back().size_bytes);  // sizes scaled to ≤ 1
  const auto n = static_cast<Eigen::Index>(samples.size());
  // Rows: [1/t, (size/scale)/t] · [latency, scale/bandwidth] ≈ 1, i.e. relative residuals.
  Eigen::MatrixXd a(n, 2);
  for (Eigen::Index i = 0; i < n; ++i) {
    const auto& m = samples[static_cast<std::size_t>(i)];
    a(i, 0) = 1.0 / m.time_s;
    a(i, 1) = m.size_bytes / scale / m.time_s;
  }
  const bool has_spread = n >= 2 && samples.front().size_bytes < samples.back().size_bytes;
  Eigen::VectorXd weights = Eigen::VectorXd::Ones(n);
  Eigen::Vector2d best = solve_line(a, weights, has_spread);
  double best_max = (a * best - Eigen::VectorXd::Ones(n)).cwiseAbs().maxCoeff();
  // Lawson's iteration: reweighting each sample by its residual moves least squares towards the
  // fit with the smallest largest relative error. It stops at the first fit within the bound,
  // the one nearest to least squares.
  for (int iteration = 0; iteration < kLawsonIterations && best_max > error_bound; ++iteration) {
    const Eigen::VectorXd residual =
        (a * solve_line(a, weights, has_spread) - Eigen::VectorXd::Ones(n)).cwiseAbs();
    weights = weights.cwiseProduct(residual).array() + 1e-15;
    weights /= weights.sum();
    const Eigen::Vector2d x = solve_line(a, weights, has_spread);
    const double worst = (a * x - Eigen::VectorXd::Ones(n)).cwiseAbs().maxCoeff();
    if (worst < best_max) {
      best_max = worst;
      best = x;
    }
  }
  CurveSegment s;
  s.min_bytes = samples.front().size_bytes;
  s.max_bytes = samples.back().size_bytes;
  s.latency_s = best(0);
  // A flat piece gets a bandwidth whose term is 0.1% of the latency at the largest size.
  s.bandwidth_Bps = best(1) > 0 ? scale / best(1) : scale / (1e-3 * std::max(best(0), 1e-12));
  return s;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const std::size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

bool CurveFit::meets(const FitOptions& goals) const {
  return median_rel_error <= goals.median_goal && max_rel_error <= goals.max_goal;
}

double CurveFit::time_s(double size_bytes) const {
  const CurveSegment* chosen = &segments.front();
  for (const auto& s : segments) {
    chosen = &s;
    if (size_bytes <= s.max_bytes) break;
  }
  return predict(*chosen, size_bytes);
}

CurveFit fit_piecewise(std::vector<MeasuredSample> samples, const FitOptions& options) {
  if (samples.empty()) throw std::invalid_argument("fit_piecewise: no samples");
  for (const auto& m : samples)
    if (!(m.time_s > 0) || !std::isfinite(m.time_s) || m.size_bytes < 0)
      throw std::invalid_argument("fit_piecewise: every sample needs a size >= 0 and a time > 0");
  std::stable_sort(
      samples.begin(), samples.end(),
      [](const MeasuredSample& a, const MeasuredSample& b) { return a.size_bytes < b.size_bytes; });

  const std::size_t n = samples.size();
  const auto min_points = std::max<std::size_t>(
      2, std::min<std::size_t>(
             static_cast<std::size_t>(std::max(1, options.min_points_per_segment)), n / 2));
  // For each number of pieces: the partition with the smallest largest error (pieces fitted
  // minimax), then each piece refitted as near to least squares as that error bound allows, which
  // lowers the median. Fewer pieces win unless more pieces do better on the goals.
  CurveFit chosen;
  for (int pieces = 1; pieces <= std::max(options.max_segments, 1); ++pieces) {
    if (pieces > 1 && static_cast<std::size_t>(pieces) * min_points > n) break;
    const Partition p =
        best_partition(samples, pieces, pieces == 1 ? std::min(min_points, n) : min_points);
    if (p.segments.empty()) continue;  // no admissible split (equal sizes everywhere)
    CurveFit candidate = refined_fit(samples, p, std::max(options.max_goal, p.max_error));
    if (chosen.segments.empty() || better_fit(candidate, chosen, options))
      chosen = std::move(candidate);
    if (chosen.meets(options)) break;
  }
  return chosen;
}

}  // namespace shardplan::calibrate
