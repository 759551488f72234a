#include <doctest/doctest.h>

#include <string>

#include <fmt/format.h>

#include "calibrate/nccl_tests_log.hpp"
#include "core/input_error.hpp"

using namespace shardplan;
using namespace shardplan::calibrate;
using documents::Collective;

namespace {

const std::string kExamples = std::string(SHARDPLAN_SOURCE_DIR) + "/examples/nccl-tests/";

const char* kHeader =
    "# nThread 1 nGpus 1 minBytes 8 maxBytes 64 step: 2(factor) warmup iters: 5 iters: 20 agg "
    "iters: 1 validation: 1 graph: 0\n"
    "#\n"
    "# Using devices\n"
    "#  Rank  0 Group  0 Pid  11 on   node-a device  0 [0x07] NVIDIA A100-SXM4-80GB\n"
    "#  Rank  1 Group  0 Pid  12 on   node-b device  0 [0x07] NVIDIA A100-SXM4-80GB\n"
    "#\n"
    "#                                                              out-of-place                   "
    "    in-place\n"
    "#       size         count      type   redop    root     time   algbw   busbw #wrong     time "
    "  algbw   busbw #wrong\n"
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us) "
    " (GB/s)  (GB/s)\n";
const char* kRows = "           8             2     float     sum      -1    10.52    0.00    0.00 "
                    "     0    10.33    0.00    0.00      0\n"
                    "          16             4     float     sum      -1    10.61    0.00    0.00 "
                    "     0    10.40    0.00    0.00      0\n";
const char* kTrailer = "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 0.0012\n#\n";

std::string error_of(const std::string& text, const std::string& path = "all_reduce_perf.log") {
  try {
    parse_nccl_tests_log(text, path);
  } catch (const core::InputError& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("nccl_tests_log::the sample all_reduce log of one node") {
  const auto log = read_nccl_tests_log(kExamples + "all_reduce_perf-8xA100.log");
  CHECK(log.op == Collective::all_reduce);
  CHECK(log.ranks == 8);
  CHECK(log.hosts == std::vector<std::string>{"dgx-a01"});
  CHECK(log.nccl_version == "2.19.3");
  CHECK(log.data_type == "float");
  REQUIRE(log.samples.size() == 28);  // 8 B .. 1 GiB
  CHECK(log.samples.front().size_bytes == 8);
  CHECK(log.samples.front().time_s == doctest::Approx(10.97e-6).epsilon(0.05));
  CHECK(log.samples.back().size_bytes == 1073741824.0);
}

TEST_CASE("nccl_tests_log::every sample log parses, size-0 rows are skipped") {
  const auto gather = read_nccl_tests_log(kExamples + "all_gather_perf-8xA100.log");
  CHECK(gather.op == Collective::all_gather);
  CHECK(gather.samples.front().size_bytes == 32);  // the rows of size 0 are not samples
  const auto scatter = read_nccl_tests_log(kExamples + "reduce_scatter_perf-8xA100.log");
  CHECK(scatter.op == Collective::reduce_scatter);
  // An older log without the test's name: the file name says all_reduce_perf; two hosts.
  const auto two_nodes = read_nccl_tests_log(kExamples + "all_reduce_perf-2x8xA100-ib.log");
  CHECK(two_nodes.op == Collective::all_reduce);
  CHECK(two_nodes.ranks == 16);
  CHECK(two_nodes.hosts.size() == 2);
  CHECK(two_nodes.nccl_version.empty());
}

TEST_CASE("nccl_tests_log::the test is found in the header, the command line or the file name") {
  const std::string table = std::string(kHeader) + kRows + kTrailer;
  CHECK(parse_nccl_tests_log("# Collective test starting: reduce_scatter_perf\n" + table, "x.log")
            .op == Collective::reduce_scatter);
  CHECK(parse_nccl_tests_log("$ mpirun -np 2 ./build/alltoall_perf -b 8 -e 64\n" + table, "x.log")
            .op == Collective::all_to_all);
  CHECK(parse_nccl_tests_log(table, "logs/all_gather_perf-run3.txt").op == Collective::all_gather);
  CHECK_FALSE(parse_nccl_tests_log(table, "x.log").op.has_value());
  CHECK(collective_named_in("all_reduce_perf") == Collective::all_reduce);  // not reduce_perf
  CHECK(collective_named_in("reduce_perf.log") == Collective::reduce);
  // NCCL's INFO lines between the rows are ignored.
  const std::string with_info =
      std::string(kHeader) + "node-a:11:11 [0] NCCL INFO Channel 00/02 : 0 1\n" + kRows + kTrailer;
  CHECK(parse_nccl_tests_log(with_info, "all_reduce_perf.log").samples.size() == 2);
}

TEST_CASE("nccl_tests_log::rows no run can have measured are refused with the file and line") {
  const std::string header(kHeader);  // two ranks of float; the first row is line 10
  const auto row = [&](const char* size, const char* count, const char* time) {
    return header +
           fmt::format("{:>12}  {:>12}     float     sum      -1  {:>7}    0.00    0.00 "
                       "     0    10.33    0.00    0.00      0\n",
                       size, count, time) +
           kTrailer;
  };
  CHECK(error_of(row("8", "2", "inf")) ==
        "all_reduce_perf.log:10: a time of inf us is not a measurement (at most 3600000000 us, "
        "an hour)");
  CHECK(error_of(row("8", "2", "1e300")).rfind("all_reduce_perf.log:10: a time of 1e+300 us", 0) ==
        0);
  // The size is the count times 4 bytes, once or (all_gather, reduce_scatter) once per rank.
  CHECK(error_of(row("99999999999999999999999", "262144", "31.22")) ==
        "all_reduce_perf.log:10: size 1e+23 is not the count 262144 times 4 bytes (times 1 or 2 "
        "ranks)");
  CHECK(error_of(row("12", "2", "10.5")).rfind("all_reduce_perf.log:10: size 12 is not", 0) == 0);
  CHECK(error_of(row("16", "2", "10.5")) == "no error");  // 2 ranks x 2 x 4 bytes
  // 1 GiB in 1 us is 1,074 TB/s.
  CHECK(error_of(row("1073741824", "268435456", "1.0")) ==
        "all_reduce_perf.log:10: 1073741824 bytes in 1 us is 1.074e+06 GB/s, beyond any link "
        "(18000 GB/s at most)");
  const auto log = parse_nccl_tests_log(header + kRows + kTrailer, "all_reduce_perf.log");
  CHECK(log.devices == std::vector<std::string>{"NVIDIA A100-SXM4-80GB"});
}

TEST_CASE("nccl_tests_log::malformed and truncated logs name the file and line") {
  const std::string header(kHeader);
  // Line numbers: the header holds 9 lines, so the first row is line 10.
  CHECK(error_of(header + kRows) == "all_reduce_perf.log:11: truncated: the table is not followed "
                                    "by nccl-tests' \"# Avg bus bandwidth\" line");
  CHECK(error_of(header + "           8             2     float     sum\n" + kTrailer)
            .rfind("all_reduce_perf.log:10: expected a table row", 0) == 0);
  CHECK(error_of(
            header +
            "           8             2     float     sum      -1    abc    0.00    0.00      0\n" +
            kTrailer)
            .rfind("all_reduce_perf.log:10: expected a table row", 0) == 0);
  CHECK(error_of(header + "node-a: Test NCCL failure common.cu:391 'unhandled system error'\n" +
                 kTrailer)
            .rfind("all_reduce_perf.log:10: expected a table row", 0) == 0);
  CHECK(error_of(header +
                 "           8             2     float     sum      -1    10.52    0.00    0.00    "
                 "  3    10.33    0.00    0.00      3\n" +
                 kTrailer)
            .rfind("all_reduce_perf.log:10: #wrong is 3", 0) == 0);
  CHECK(error_of(header + kRows +
                 "          32             4      half     sum      -1    10.52    0.00    0.00    "
                 "  0    10.33    0.00    0.00      0\n" +
                 kTrailer)
            .rfind("all_reduce_perf.log:12: the log mixes types float and half", 0) == 0);
  CHECK(error_of(header + kTrailer) == "all_reduce_perf.log:8: the table has no rows");
  CHECK(
      error_of("# nThread 1 nGpus 1\n") ==
      "all_reduce_perf.log: no nccl-tests table: no \"#  size  count  type ... time\" header line");
  CHECK(
      error_of(header + kRows + kTrailer + kRows).rfind("all_reduce_perf.log:15: a row after", 0) ==
      0);
  CHECK_THROWS_WITH_AS(read_nccl_tests_log(kExamples + "no-such.log"),
                       doctest::Contains("cannot open file"), core::InputError);
}
