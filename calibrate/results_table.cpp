#include "calibrate/results_table.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ostream.h>

namespace shardplan::calibrate {
namespace {

bool reduces(documents::Collective op) {
  return op == documents::Collective::all_reduce || op == documents::Collective::reduce_scatter ||
         op == documents::Collective::reduce;
}

bool rooted(documents::Collective op) {
  return op == documents::Collective::broadcast || op == documents::Collective::reduce;
}

}  // namespace

std::string format_time_us(double us) {
  if (us >= 10000.0) return fmt::format("{:7.0f}", us);
  if (us >= 100.0) return fmt::format("{:7.1f}", us);
  return fmt::format("{:7.2f}", us);
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  if (u == 0 || bytes == std::floor(bytes)) return fmt::format("{:.0f} {}", bytes, units[u]);
  return fmt::format("{:.3g} {}", bytes, units[u]);
}

void print_sweep_table(std::ostream& out, const SweepResult& sweep) {
  SweepTablePrinter printer(out, sweep.op, sweep.group);
  for (const auto& p : sweep.points) printer.add(p);
  printer.finish();
}

SweepTablePrinter::SweepTablePrinter(std::ostream& out, documents::Collective op,
                                     const PlannedGroup& group)
    : out_(out), op_(op), group_(group) {}

void SweepTablePrinter::header() {
  if (header_printed_) return;
  header_printed_ = true;
  const auto& g = group_;
  fmt::print(out_, "#\n# {} on {}: {} group{} of {} ranks, {}\n", documents::traits(op_).name,
             g.name, g.groups, g.groups == 1 ? "" : "s", g.ranks, documents::tier_name(g.tier));
  fmt::print(out_, "#\n# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}            out-of-place\n", "", "", "",
             "", "");
  fmt::print(out_, "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}\n", "size",
             "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong");
  fmt::print(out_, "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>5}\n", "(B)",
             "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "");
}

void SweepTablePrinter::add(const PointResult& p) {
  header();
  fmt::print(out_, "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}  {}  {:6.2f}  {:6.2f}  {:>5}\n",
             p.point.size_bytes, p.point.count, "float", reduces(op_) ? "sum" : "none",
             rooted(op_) ? "0" : "-1", format_time_us(p.time_s * 1e6), p.algbw_GBps, p.busbw_GBps,
             p.wrong < 0 ? std::string("N/A") : std::to_string(p.wrong));
  busbw_sum_ += p.busbw_GBps;
  ++rows_;
  out_.flush();
}

void SweepTablePrinter::finish() {
  header();
  fmt::print(out_, "# Avg bus bandwidth    : {:.4f}\n", busbw_sum_ / std::max(1, rows_));
  out_.flush();
}

void print_fit(std::ostream& out, const CurveFit& fit) {
  fmt::print(out,
             "# fit: {} piece{}, error at the {} measured sizes: median {:.1f}%, max {:.1f}%\n",
             fit.segments.size(), fit.segments.size() == 1 ? "" : "s", fit.samples.size(),
             100 * fit.median_rel_error, 100 * fit.max_rel_error);
  for (const auto& s : fit.segments)
    fmt::print(out, "#   {:>10} .. {:<10}  time = {:.2f} us + size / {:.3f} GB/s\n",
               human_bytes(s.min_bytes), human_bytes(s.max_bytes), s.latency_s * 1e6,
               s.bandwidth_Bps / 1e9);
}

void print_gemm_table(std::ostream& out, const std::vector<GemmMeasurement>& gemms) {
  fmt::print(out, "#\n# GEMM C = A·B (A m×k, B k×n), slowest rank\n");
  fmt::print(out, "# {:>7}  {:>7}  {:>7}  {:>5}  {:>10}  {:>8}  {}\n", "m", "n", "k", "type",
             "time(us)", "TFLOP/s", "shape");
  for (const auto& g : gemms)
    fmt::print(out, "  {:>7}  {:>7}  {:>7}  {:>5}  {:>10.1f}  {:>8.3f}  {}\n", g.shape.m, g.shape.n,
               g.shape.k, documents::dtype_name(g.dtype), g.time_s * 1e6, g.flops_per_s() / 1e12,
               g.model_shape ? "model" : "square");
}

void print_attention_lines(std::ostream& out,
                           const std::vector<documents::AttentionSample>& cores) {
  for (const auto& a : cores)
    fmt::print(out,
               "# attention {} {} (batch {}, seq {}, heads {}, kv_heads {}, head_dim {}), slowest "
               "rank: forward {:.1f} us, backward {:.1f} us\n",
               a.impl, documents::dtype_name(a.dtype), a.batch, a.seq, a.heads, a.kv_heads,
               a.head_dim, a.forward_s * 1e6, a.backward_s * 1e6);
}

ProgressBar::ProgressBar(std::ostream& out, int total_steps, bool enabled)
    : out_(out), total_(std::max(1, total_steps)), enabled_(enabled) {}

ProgressBar::~ProgressBar() { clear(); }

void ProgressBar::show(std::string_view label) {
  if (!enabled_) return;
  constexpr int kWidth = 30;
  const int filled = kWidth * done_ / total_;
  out_ << '\r' << '[' << std::string(static_cast<std::size_t>(filled), '#')
       << std::string(static_cast<std::size_t>(kWidth - filled), ' ') << "] "
       << fmt::format("{:>4}/{:<4} ", done_, total_) << label << "\033[K" << std::flush;
  drawn_ = true;
}

void ProgressBar::step() { done_ = std::min(done_ + 1, total_); }

void ProgressBar::clear() {
  if (!enabled_ || !drawn_) return;
  out_ << "\r\033[K" << std::flush;
  drawn_ = false;
}

}  // namespace shardplan::calibrate
