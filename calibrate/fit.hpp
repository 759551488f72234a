// Fitting a collective's measured times with a piecewise alpha-beta model: over each size regime
// (latency-bound, transition, bandwidth-bound) time = latency + size / bandwidth, the form of
// NCCL's own cost model (src/graph/tuning.cc: latency + bytes / bandwidth per algorithm and
// protocol). The breakpoints are those that minimize the largest relative error (each piece
// fitted minimax); each piece is then refitted as near to least squares of the relative error as
// that bound allows; the fewest pieces that reach the goals are kept.
#pragma once

#include <span>
#include <vector>

#include "documents/hardware.hpp"

namespace shardplan::calibrate {

struct FitOptions {
  // Latency-bound, transition, bandwidth-bound; the transition may need more than one piece:
  // NCCL switches protocol (LL, LL128, Simple) and algorithm inside it, MPI switches from eager to
  // rendezvous, and CPU copies slow down as buffers outgrow the caches.
  int max_segments = 5;
  int min_points_per_segment = 3;  // lowered automatically when there are too few samples
  double median_goal = 0.05;       // relative error at the measured points
  double max_goal = 0.10;
};

struct CurveFit {
  std::vector<documents::MeasuredSample> samples;  // sorted by size
  std::vector<documents::CurveSegment> segments;   // ordered by size, contiguous
  std::vector<double> relative_errors;             // |fit − measured| / measured, per sample
  double median_rel_error = 0;
  double max_rel_error = 0;
  bool meets(const FitOptions& goals) const;
  // As documents::CollectiveCurve::time_s: the first segment whose max_bytes ≥ size.
  double time_s(double size_bytes) const;
};

// Throws std::invalid_argument when there is no sample or a time is not positive.
CurveFit fit_piecewise(std::vector<documents::MeasuredSample> samples,
                       const FitOptions& options = {});

// One piece over `samples`: latency + size / bandwidth with latency ≥ 0 and bandwidth > 0 (a flat
// piece gets a bandwidth whose term is negligible). Least squares of the relative error when its
// largest relative error is within `error_bound`; otherwise reweighted towards the smallest
// largest relative error (Lawson's iteration), stopping once within the bound.
documents::CurveSegment fit_segment(std::span<const documents::MeasuredSample> samples,
                                    double error_bound = 1e300);

double median(std::vector<double> values);

}  // namespace shardplan::calibrate
