#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

#include "calibrate/fit.hpp"

using namespace shardplan;
using calibrate::fit_piecewise;
using calibrate::fit_segment;
using documents::MeasuredSample;

namespace {

// Sizes 8 B .. 1 GiB by factors of 2 (nccl-tests -b 8 -e 1G -f 2).
std::vector<double> sweep_sizes() {
  std::vector<double> sizes;
  for (double s = 8; s <= 1073741824.0; s *= 2) sizes.push_back(s);
  return sizes;
}

struct Line {
  double latency_s;
  double bandwidth_Bps;
  double time(double size) const { return latency_s + size / bandwidth_Bps; }
};

// Samples of the lowest of several lines (as NCCL picks the fastest protocol at each size), with
// multiplicative Gaussian noise of relative size `noise`, from a fixed seed.
std::vector<MeasuredSample> samples_of(const std::vector<Line>& lines, double noise,
                                       unsigned seed) {
  std::mt19937 generator(seed);
  std::normal_distribution<double> gauss(0.0, noise);
  std::vector<MeasuredSample> out;
  for (double s : sweep_sizes()) {
    double t = 1e300;
    for (const auto& l : lines) t = std::min(t, l.time(s));
    out.push_back({s, t * (1.0 + gauss(generator))});
  }
  return out;
}

}  // namespace

TEST_CASE("fit::one noiseless line is recovered exactly by one piece") {
  const Line line{25e-6, 40e9};
  const auto fit = fit_piecewise(samples_of({line}, 0.0, 1));
  REQUIRE(fit.segments.size() == 1);
  CHECK(fit.segments[0].latency_s == doctest::Approx(25e-6).epsilon(1e-9));
  CHECK(fit.segments[0].bandwidth_Bps == doctest::Approx(40e9).epsilon(1e-9));
  CHECK(fit.max_rel_error < 1e-9);
  CHECK(fit.segments[0].min_bytes == 8);
  CHECK(fit.segments[0].max_bytes == 1073741824.0);
}

TEST_CASE("fit::latency and bandwidth of one line under 2% noise, for several seeds") {
  for (unsigned seed : {1u, 2u, 3u, 4u, 5u}) {
    CAPTURE(seed);
    const auto fit = fit_piecewise(samples_of({{12e-6, 150e9}}, 0.02, seed));
    REQUIRE(fit.segments.size() >= 1);
    // The smallest sizes decide the latency, the largest the bandwidth.
    CHECK(fit.time_s(8) == doctest::Approx(12e-6).epsilon(0.03));
    CHECK(fit.segments.back().bandwidth_Bps == doctest::Approx(150e9).epsilon(0.03));
    CHECK(fit.median_rel_error <= 0.05);
    CHECK(fit.max_rel_error <= 0.10);
  }
}

TEST_CASE("fit::three regimes (latency-bound, transition, bandwidth-bound) under 1% noise") {
  // An 8-GPU NVLink all-reduce shaped like NCCL's LL, LL128 and Simple protocols.
  const std::vector<Line> protocols = {{11e-6, 12e9}, {17e-6, 75e9}, {45e-6, 132e9}};
  const auto fit = fit_piecewise(samples_of(protocols, 0.01, 42));
  REQUIRE(fit.segments.size() >= 3);
  CHECK(fit.median_rel_error <= 0.05);
  CHECK(fit.max_rel_error <= 0.10);
  CHECK(fit.segments.front().latency_s == doctest::Approx(11e-6).epsilon(0.05));
  CHECK(fit.segments.back().bandwidth_Bps == doctest::Approx(132e9).epsilon(0.03));
  CHECK(fit.segments.back().latency_s == doctest::Approx(45e-6).epsilon(0.25));
  // Pieces are ordered and contiguous, covering the measured range.
  CHECK(fit.segments.front().min_bytes == 8);
  CHECK(fit.segments.back().max_bytes == 1073741824.0);
  for (std::size_t i = 1; i < fit.segments.size(); ++i)
    CHECK(fit.segments[i].min_bytes == fit.segments[i - 1].max_bytes);
  // The reported errors are those of the curve as the cost model evaluates it.
  for (std::size_t i = 0; i < fit.samples.size(); ++i)
    CHECK(fit.relative_errors[i] ==
          doctest::Approx(std::fabs(fit.time_s(fit.samples[i].size_bytes) - fit.samples[i].time_s) /
                          fit.samples[i].time_s));
}

TEST_CASE("fit::fewest pieces that meet the goals") {
  const auto fit = fit_piecewise(samples_of({{30e-6, 20e9}}, 0.005, 9));
  CHECK(fit.segments.size() == 1);
  calibrate::FitOptions one_piece;
  one_piece.max_segments = 1;
  const auto forced = fit_piecewise(samples_of({{11e-6, 12e9}, {45e-6, 132e9}}, 0.0, 1), one_piece);
  CHECK(forced.segments.size() == 1);
  CHECK_FALSE(forced.meets(one_piece));
}

TEST_CASE("fit::a piece keeps latency >= 0 and bandwidth > 0") {
  // Times proportional to size: the unconstrained line would have a slightly negative latency.
  const std::vector<MeasuredSample> through_origin = {
      {1e6, 0.99e-4}, {2e6, 2.0e-4}, {4e6, 4.02e-4}};
  const auto a = fit_segment(through_origin);
  CHECK(a.latency_s >= 0);
  CHECK(a.bandwidth_Bps == doctest::Approx(1e10).epsilon(0.02));
  // Times falling with size: a flat piece.
  const std::vector<MeasuredSample> falling = {{8, 10e-6}, {16, 9e-6}, {32, 8e-6}};
  const auto b = fit_segment(falling);
  CHECK(b.bandwidth_Bps > 0);
  CHECK(b.latency_s == doctest::Approx(9e-6).epsilon(0.05));
  CHECK(32 / b.bandwidth_Bps < 1e-3 * b.latency_s * 1.0001);
}

TEST_CASE("fit::few samples, equal sizes and bad input") {
  const auto single = fit_piecewise({{1024, 5e-6}});
  REQUIRE(single.segments.size() == 1);
  CHECK(single.time_s(1024) == doctest::Approx(5e-6));
  const auto repeated = fit_piecewise({{64, 5e-6}, {64, 6e-6}, {64, 5.5e-6}});
  CHECK(repeated.segments.size() == 1);
  CHECK(repeated.time_s(64) == doctest::Approx(5.5e-6).epsilon(0.02));
  const auto unsorted = fit_piecewise({{4096, 3e-6}, {8, 1e-6}, {512, 1.25e-6}});
  CHECK(unsorted.samples.front().size_bytes == 8);
  CHECK_THROWS_AS(fit_piecewise({}), std::invalid_argument);
  CHECK_THROWS_AS(fit_piecewise({{8, 0.0}}), std::invalid_argument);
  CHECK_THROWS_AS(fit_piecewise({{8, -1e-6}}), std::invalid_argument);
}

TEST_CASE("fit::median") {
  CHECK(calibrate::median({3, 1, 2}) == 2);
  CHECK(calibrate::median({4, 1, 3, 2}) == 2.5);
  CHECK(calibrate::median({}) == 0);
}
