#include <doctest/doctest.h>

#include <sstream>
#include <string>

#include "calibrate/nccl_tests_log.hpp"
#include "calibrate/results_table.hpp"

using namespace shardplan;
using namespace shardplan::calibrate;

namespace {

SweepResult two_point_sweep() {
  SweepResult sweep;
  sweep.op = documents::Collective::all_gather;
  sweep.group = {{comm::GroupKind::world, 0}, "world", 4, 1, documents::Tier::intra_node};
  for (std::uint64_t size : {64u, 1u << 20}) {
    PointResult p;
    p.point = sweep_point(sweep.op, 4, size, 4);
    p.time_s = 5e-6 + static_cast<double>(size) / 10e9;
    p.algbw_GBps = documents::algbw_GBps(static_cast<double>(p.point.size_bytes), p.time_s);
    p.busbw_GBps =
        documents::busbw_GBps(sweep.op, 4, static_cast<double>(p.point.size_bytes), p.time_s);
    p.wrong = 0;
    sweep.points.push_back(p);
  }
  return sweep;
}

}  // namespace

TEST_CASE("results_table::time column as nccl-tests prints it") {
  CHECK(format_time_us(10.523) == "  10.52");
  CHECK(format_time_us(135.84) == "  135.8");
  CHECK(format_time_us(12646.3) == "  12646");
}

TEST_CASE("results_table::rows in nccl-tests' column layout") {
  std::ostringstream out;
  print_sweep_table(out, two_point_sweep());
  const std::string text = out.str();
  CHECK(text.find("#       size         count      type   redop    root     time   algbw   busbw  "
                  "#wrong") != std::string::npos);
  // 64 B on 4 ranks: 16 floats, 4 per rank; 5.0064 µs; algbw 0.0128 GB/s; busbw × 3/4.
  CHECK(text.find("          64             4     float    none      -1     5.01    0.01    0.01   "
                  "   0\n") != std::string::npos);
  CHECK(text.find("     1048576         65536     float    none      -1    109.9    9.54    7.16   "
                  "   0\n") != std::string::npos);
  CHECK(text.find("# Avg bus bandwidth    : ") != std::string::npos);
}

TEST_CASE("results_table::each size's row is printed as soon as it is measured") {
  const SweepResult sweep = two_point_sweep();
  std::ostringstream streamed;
  SweepTablePrinter printer(streamed, sweep.op, sweep.group);
  CHECK(streamed.str().empty());  // nothing before the first size is measured
  printer.add(sweep.points[0]);
  const std::string after_first = streamed.str();
  // The header and the 64 B row, and neither the 1 MiB row nor the average yet.
  CHECK(after_first.find("# all_gather on world: 1 group of 4 ranks") != std::string::npos);
  CHECK(after_first.find("          64             4     float") != std::string::npos);
  CHECK(after_first.find("     1048576") == std::string::npos);
  CHECK(after_first.find("# Avg bus bandwidth") == std::string::npos);
  printer.add(sweep.points[1]);
  CHECK(streamed.str().find("     1048576         65536") != std::string::npos);
  CHECK(streamed.str().find("# Avg bus bandwidth") == std::string::npos);
  printer.finish();
  // Streamed or printed at once, the table is the same text.
  std::ostringstream whole;
  print_sweep_table(whole, sweep);
  CHECK(streamed.str() == whole.str());
}

TEST_CASE("results_table::a table calibrate prints imports as an nccl-tests log") {
  std::ostringstream out;
  print_sweep_table(out, two_point_sweep());
  const auto log = parse_nccl_tests_log(out.str(), "all_gather_perf.log");
  REQUIRE(log.samples.size() == 2);
  CHECK(log.samples[1].size_bytes == 1048576);
  CHECK(log.samples[1].time_s == doctest::Approx(109.9e-6).epsilon(1e-3));
}

TEST_CASE("results_table::fit lines and human sizes") {
  std::ostringstream out;
  print_fit(out, fit_piecewise({{8, 5e-6}, {1024, 5.1e-6}, {1 << 20, 110e-6}}));
  CHECK(out.str().rfind("# fit: 1 piece, error at the 3 measured sizes: median", 0) == 0);
  CHECK(human_bytes(8) == "8 B");
  CHECK(human_bytes(65536) == "64 KiB");
  CHECK(human_bytes(1.5 * 1048576) == "1.5 MiB");
}

TEST_CASE("results_table::one line per attention core: impl, shape, forward and backward") {
  std::ostringstream out;
  print_attention_lines(out,
                        {{"eager", documents::DType::fp32, 2, 128, 4, 2, 32, 812.34e-6, 1534.56e-6},
                         {"flash", documents::DType::bf16, 1, 4096, 32, 8, 128, 1.25e-3, 3.5e-3}});
  CHECK(out.str() == "# attention eager fp32 (batch 2, seq 128, heads 4, kv_heads 2, head_dim 32), "
                     "slowest rank: forward 812.3 us, backward 1534.6 us\n"
                     "# attention flash bf16 (batch 1, seq 4096, heads 32, kv_heads 8, head_dim "
                     "128), slowest rank: forward 1250.0 us, backward 3500.0 us\n");
  std::ostringstream none;
  print_attention_lines(none, {});
  CHECK(none.str().empty());
}

TEST_CASE("results_table::the progress bar draws only when enabled") {
  std::ostringstream off, on;
  ProgressBar quiet(off, 10, false);
  quiet.show("x");
  quiet.step();
  quiet.clear();
  CHECK(off.str().empty());
  {
    ProgressBar bar(on, 4, true);
    bar.step();
    bar.show("all_reduce world 8 B");
  }
  CHECK(on.str().find("[#######                       ]    1/4    all_reduce world 8 B") !=
        std::string::npos);
  CHECK(on.str().find("\r\033[K") != std::string::npos);  // erased on destruction
}
