#include <doctest/doctest.h>

#include "costmodel/comm_model.hpp"

using namespace shardplan::costmodel;
using namespace shardplan::documents;

TEST_CASE("comm_model::nccl-tests bus bandwidth factors") {
  // nccl-tests doc/PERFORMANCE.md: busbw = algbw × 2(n−1)/n for all-reduce, (n−1)/n for
  // all-gather and reduce-scatter, 1 for broadcast.
  CHECK(traits(Collective::all_reduce).bus_factor(8) == doctest::Approx(1.75));
  CHECK(traits(Collective::all_gather).bus_factor(8) == doctest::Approx(0.875));
  CHECK(traits(Collective::reduce_scatter).bus_factor(4) == doctest::Approx(0.75));
  CHECK(traits(Collective::broadcast).bus_factor(4) == doctest::Approx(1.0));
  CHECK(busbw_GBps(Collective::all_reduce, 8, 1e9, 0.01) == doctest::Approx(175.0));
  CHECK(collective_from_name("reduce_scatter") == Collective::reduce_scatter);
  CHECK_FALSE(collective_from_name("allreduce").has_value());
}

TEST_CASE("comm_model::datasheet ring at large sizes") {
  const auto hw = load_hardware("a100-sxm4-80gb");
  CommModel cm(hw);
  // 8 GPUs on NVLink (300 GB/s each way): a 1 GB all-reduce sends 1.75 GB per GPU.
  const auto c = cm.cost(Collective::all_reduce, {8, 8}, 1e9);
  CHECK(c.bytes_sent == doctest::Approx(1.75e9));
  CHECK(c.seconds == doctest::Approx(1.75e9 / 300e9).epsilon(0.01));
  // Across nodes the 8 NICs of 25 GB/s carry it: busbw 200 GB/s.
  const auto x = cm.cost(Collective::all_reduce, {16, 8}, 1e9);
  CHECK(x.seconds == doctest::Approx(2 * 15.0 / 16 * 1e9 / 200e9).epsilon(0.01));
  // One rank per node (HSDP replicas): one NIC.
  const auto r = cm.cost(Collective::all_reduce, {4, 1}, 1e9);
  CHECK(r.seconds == doctest::Approx(1.5e9 / 25e9).epsilon(0.01));
  CHECK(cm.cost(Collective::all_gather, {1, 1}, 1e9).seconds == 0);
}

TEST_CASE("comm_model::calibrated curves take precedence and interpolate") {
  auto hw = load_hardware("a100-sxm4-80gb");
  Calibration cal;
  cal.backend = "nccl";
  cal.ranks = 8;
  for (int n : {2, 8}) {
    CollectiveCurve c;
    c.op = Collective::all_gather;
    c.ranks = n;
    c.tier = Tier::intra_node;
    // busbw 100 GB/s at every size: time = 10 us + size·(n−1)/n / 100e9.
    const double f = (n - 1.0) / n;
    c.segments.push_back({0, 1e12, 10e-6, 100e9 / f});
    cal.collectives.push_back(c);
  }
  hw.calibration = cal;
  CommModel cm(hw);
  const auto at8 = cm.cost(Collective::all_gather, {8, 8}, 1e9);
  CHECK(at8.calibrated);
  CHECK_FALSE(at8.extrapolated);
  CHECK(at8.seconds == doctest::Approx(10e-6 + 0.875e9 / 100e9));
  const auto at4 = cm.cost(Collective::all_gather, {4, 4}, 1e9);
  CHECK(at4.seconds == doctest::Approx(10e-6 + 0.75e9 / 100e9));
  const auto at16 = cm.cost(Collective::all_gather, {16, 8}, 1e9);  // inter-node: not measured
  CHECK_FALSE(at16.calibrated);
}
