// What rank 0 prints: each sweep as a table in nccl-tests' column layout (size, count, type,
// redop, root, time, algbw, busbw, #wrong; out-of-place only) so it can be compared with the
// nccl-tests runs users know, its fitted curve, and a progress bar while measuring.
#pragma once

#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "calibrate/collective_bench.hpp"
#include "calibrate/fit.hpp"
#include "calibrate/gemm_shapes.hpp"
#include "calibrate/group_plan.hpp"
#include "documents/hardware.hpp"

namespace shardplan::calibrate {

struct SweepResult {
  documents::Collective op = documents::Collective::all_reduce;
  PlannedGroup group;
  std::vector<PointResult> points;
};

// nccl-tests' time column: 2 decimals below 100 µs, 1 below 10 ms, none above.
std::string format_time_us(double microseconds);
void print_sweep_table(std::ostream& out, const SweepResult& sweep);

// The same table printed as the sweep runs, as nccl-tests does: the header first, each size's
// row (flushed) as soon as it is measured, the average bus bandwidth at the end. The printed text
// equals print_sweep_table's of the points added.
class SweepTablePrinter {
public:
  SweepTablePrinter(std::ostream& out, documents::Collective op, const PlannedGroup& group);
  void add(const PointResult& point);  // prints the header before the first row
  void finish();                       // the average line (and the header when no row came)

private:
  void header();
  std::ostream& out_;
  documents::Collective op_;
  PlannedGroup group_;
  bool header_printed_ = false;
  int rows_ = 0;
  double busbw_sum_ = 0;
};
// "# fit: 2 pieces, error at the 23 points: median 1.2%, max 4.0%" and one line per piece.
void print_fit(std::ostream& out, const CurveFit& fit);
void print_gemm_table(std::ostream& out, const std::vector<GemmMeasurement>& gemms);
// One line per attention core: "# attention eager fp32 (batch 2, seq 128, heads 4, kv_heads 2,
// head_dim 32), slowest rank: forward 123.4 us, backward 234.5 us".
void print_attention_lines(std::ostream& out, const std::vector<documents::AttentionSample>& cores);
// Human units for notes: "8 B", "64 KiB", "1.5 MiB".
std::string human_bytes(double bytes);

// A one-line bar redrawn on a terminal; does nothing when disabled.
class ProgressBar {
public:
  ProgressBar(std::ostream& out, int total_steps, bool enabled);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;
  void show(std::string_view label);  // draws the bar with the current step and label
  void step();                        // one step done
  void clear();                       // erases the line (before printing a table)

private:
  std::ostream& out_;
  int total_;
  int done_ = 0;
  bool enabled_;
  bool drawn_ = false;
};

}  // namespace shardplan::calibrate
