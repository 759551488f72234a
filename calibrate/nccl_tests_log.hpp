// Reading the output of nccl-tests (all_reduce_perf, all_gather_perf, reduce_scatter_perf, ...),
// laid out as its README and src/common.cu print it: header lines starting with '#' (the
// parameters, one "#  Rank  r Group g Pid p on HOST device d ..." line per rank, the column
// headers "#  size  count  type  redop  root  time  algbw  busbw  #wrong ..."), then one row per
// size, then "# Out of bounds values : ..." and "# Avg bus bandwidth : ...". The out-of-place time
// (the first "time" column, µs) is what is kept; rows of size 0 (too few elements for every rank
// to get one) are skipped. Malformed or truncated logs are an InputError
// naming the file and line, and so is a row no run can have measured: a time that is not finite
// or above an hour, a size that is not the row's count times its type's bytes (times the ranks,
// for the collectives whose size counts every rank's part), or a bandwidth beyond
// kMaxAlgorithmBandwidth.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "documents/collectives.hpp"
#include "documents/hardware.hpp"

namespace shardplan::calibrate {

struct NcclTestsLog {
  std::string path;
  std::optional<documents::Collective> op;  // named in the log or its file name
  int ranks = 0;                            // "#  Rank" lines (0: none)
  std::vector<std::string> hosts;           // distinct hosts of those lines, in order
  std::vector<std::string> devices;         // distinct device names of those lines, in order
                                            // ("NVIDIA A100-SXM4-80GB")
  std::string nccl_version;                 // "2.19.3" from "nccl-library=21903" ("" if absent)
  std::string data_type;                    // the type column ("float")
  std::vector<documents::MeasuredSample>
      samples;  // size (nccl-tests' size column), out-of-place time
};

// Bytes per second no collective reaches: ten times 1.8 TB/s, NVLink 5's bandwidth per GPU in
// both directions together (NVIDIA's GB200 NVL72 datasheet), the fastest link a GPU has.
constexpr double kMaxAlgorithmBandwidth = 18e12;
// No benchmark sweep waits an hour for one collective: nccl-tests runs each size 25 times by
// default (5 warm-up, 20 timed).
constexpr double kMaxRowTimeUs = 3.6e9;

// `text` is the whole log; `path` names it in errors and may name the test ("all_gather_perf.log").
NcclTestsLog parse_nccl_tests_log(const std::string& text, const std::string& path);
NcclTestsLog read_nccl_tests_log(const std::string& path);

// The collective whose nccl-tests binary name ("all_reduce_perf") or profile name ("all_reduce")
// appears in `text`; the longest match wins ("all_reduce_perf" over "reduce_perf").
std::optional<documents::Collective> collective_named_in(const std::string& text);

}  // namespace shardplan::calibrate
