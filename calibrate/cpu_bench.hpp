// Compute and memory microbenchmarks of one CPU rank (single-threaded Eigen, as the CPU executor
// runs): fp32 GEMM time, memory copy bandwidth, and the rate of an Adam update.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "calibrate/gemm_shapes.hpp"

namespace shardplan::calibrate {

// Seconds per GEMM C = A·B (A m×k, B k×n, fp32): the median of at least three timed runs (more
// when they fill less than `min_seconds`), after one untimed run.
double time_cpu_gemm(const GemmShape& shape, double min_seconds = 0.05);
// Bytes moved per second by memcpy of a `bytes` buffer, counting read and write (STREAM's Copy
// convention: 2 × bytes per copy).
double measure_cpu_copy_bandwidth(std::size_t bytes, int repetitions);
// Parameters per second of a fused Adam step (Kingma & Ba 2015, Algorithm 1) on fp32 arrays of
// `params` elements: the host-side optimizer of an offloaded run.
double measure_cpu_adam_rate(std::size_t params, int repetitions);
// Seconds of each of `repetitions` runs of the shapes' GEMMs back to back (one untimed run first),
// each run begun by start_together() (a barrier across the ranks).
std::vector<double> time_cpu_gemm_sequence(const std::vector<GemmShape>& shapes, int repetitions,
                                           const std::function<void()>& start_together);

}  // namespace shardplan::calibrate
