#include <doctest/doctest.h>

#include <string>

#include "calibrate/profile_writer.hpp"
#include "core/input_error.hpp"
#include "core/json_reader.hpp"
#include "documents/hardware.hpp"

using namespace shardplan;
using namespace shardplan::calibrate;
using documents::Collective;
using documents::Tier;

namespace {

const std::string kA100 =
    std::string(SHARDPLAN_SOURCE_DIR) + "/hardware_profiles/a100-sxm4-80gb.json";

FittedCurve curve(Collective op, int ranks, Tier tier, double latency_s, double bandwidth_Bps) {
  std::vector<documents::MeasuredSample> samples;
  for (double s = 8; s <= 1 << 20; s *= 4) samples.push_back({s, latency_s + s / bandwidth_Bps});
  return {op, ranks, tier, fit_piecewise(samples), FitOptions{}};
}

CalibrationRecord record() {
  CalibrationRecord r;
  r.date = "2025-01-31T12:00:00Z";
  r.backend = "mpi";
  r.host = "node-a,node-b";
  r.library = "Open MPI v4.1.4";
  r.ranks = 8;
  r.curves = {curve(Collective::all_reduce, 8, Tier::inter_node, 20e-6, 10e9),
              curve(Collective::all_reduce, 4, Tier::intra_node, 4e-6, 30e9),
              curve(Collective::all_gather, 4, Tier::intra_node, 3e-6, 40e9)};
  r.gemm = {{{256, 768, 768}, documents::DType::fp32, 2e-3, true}};
  r.compute_efficiency = 0.8;
  r.memory_bandwidth_Bps = 20e9;
  r.extra = {{"note", "test"}};
  return r;
}

MeasuredSystem system() {
  MeasuredSystem s;
  s.name = "test-cpu";
  s.device = "Test CPU";
  s.device_memory_bytes = 16.0 * (1u << 30);
  s.device_memory_note = "test";
  s.peak_flops = {{documents::DType::fp32, 100e9}};
  s.compute_efficiency = 0.8;
  s.memory_bandwidth_Bps = 20e9;
  s.ranks_per_node = 4;
  s.host_memory_bytes = 64.0 * (1u << 30);
  s.host_link_Bps = 20e9;
  s.host_link_note = "test";
  s.optimizer_params_per_s = 0.5e9;
  return s;
}

}  // namespace

TEST_CASE("profile_writer::the calibration section reads back through the cost model") {
  auto profile = core::read_json_file(kA100);
  const auto merged = merge_calibration(profile, calibration_to_json(record()));
  const auto hw = documents::hardware_from_json(merged, "merged");
  REQUIRE(hw.calibration.has_value());
  const auto& c = *hw.calibration;
  CHECK(c.date == "2025-01-31T12:00:00Z");
  CHECK(c.backend == "mpi");
  CHECK(c.ranks == 8);
  REQUIRE(c.collectives.size() == 3);
  CHECK(c.collectives[0].op == Collective::all_reduce);
  CHECK(c.collectives[0].tier == Tier::inter_node);
  CHECK(c.collectives[0].time_s(1 << 20) ==
        doctest::Approx(20e-6 + (1 << 20) / 10e9).epsilon(1e-4));
  CHECK(c.collectives[2].segments.front().bandwidth_Bps == doctest::Approx(40e9).epsilon(1e-4));
  CHECK(c.collectives[1].samples.size() == 9);
  REQUIRE(c.gemm.size() == 1);
  CHECK(c.gemm[0].flops_per_s() == doctest::Approx(2.0 * 256 * 768 * 768 / 2e-3));
  CHECK(c.compute_efficiency == doctest::Approx(0.8));
  CHECK(c.memory_bandwidth_Bps == doctest::Approx(20e9));
  CHECK(c.extra.at("note") == "test");
  // The datasheet part is untouched.
  CHECK(hw.intra_bandwidth_Bps == doctest::Approx(300e9));
}

TEST_CASE(
    "profile_writer::merging replaces curves of the same op, ranks and tier and keeps the rest") {
  auto profile = core::read_json_file(kA100);
  auto first = merge_calibration(profile, calibration_to_json(record()));
  CalibrationRecord second;
  second.date = "2025-02-01T00:00:00Z";
  second.backend = "nccl";
  second.host = "node-c";
  second.library = "NCCL 2.21.5";
  second.ranks = 4;
  second.curves = {curve(Collective::all_reduce, 4, Tier::intra_node, 5e-6, 50e9),
                   curve(Collective::reduce_scatter, 4, Tier::intra_node, 5e-6, 45e9)};
  second.extra = {{"other", 1}};
  const auto merged = merge_calibration(first, calibration_to_json(second));
  const auto hw = documents::hardware_from_json(merged, "merged");
  const auto& c = *hw.calibration;
  CHECK(c.backend == "nccl");
  CHECK(c.host == "node-c");
  REQUIRE(c.collectives.size() == 4);
  CHECK(c.collectives[1].op == Collective::all_reduce);
  CHECK(c.collectives[1].segments.back().bandwidth_Bps == doctest::Approx(50e9).epsilon(1e-4));
  CHECK(c.collectives[3].op == Collective::reduce_scatter);
  CHECK(c.gemm.size() == 1);  // kept: the new section has none
  CHECK(c.compute_efficiency == doctest::Approx(0.8));
  CHECK(c.extra.at("note") == "test");
  CHECK(c.extra.at("other") == 1);
}

TEST_CASE("profile_writer::attention cores are written in the profile's schema and read back") {
  auto r = record();
  r.attention = {{"eager", documents::DType::fp32, 2, 128, 4, 2, 32, 812.34e-6, 1534.56e-6},
                 {"flash", documents::DType::bf16, 1, 4096, 32, 8, 128, 1.25e-3, 3.5e-3}};
  const auto section = calibration_to_json(r);
  REQUIRE(section.at("attention").size() == 2);
  CHECK(section.at("attention").at(0) == nlohmann::json{{"impl", "eager"},
                                                        {"dtype", "fp32"},
                                                        {"batch", 2},
                                                        {"seq", 128},
                                                        {"heads", 4},
                                                        {"kv_heads", 2},
                                                        {"head_dim", 32},
                                                        {"forward_us", 812.34},
                                                        {"backward_us", 1534.6}});
  // What calibrate writes, the cost model reads: in a merged profile and in a measured one.
  for (const auto& doc :
       {merge_calibration(core::read_json_file(kA100), section), measured_profile(system(), r)}) {
    const auto hw = documents::hardware_from_json(doc, "x");
    REQUIRE(hw.calibration.has_value());
    const auto& a = hw.calibration->attention;
    REQUIRE(a.size() == 2);
    CHECK(a[0].impl == "eager");
    CHECK(a[0].dtype == documents::DType::fp32);
    CHECK(a[0].batch == 2);
    CHECK(a[0].seq == 128);
    CHECK(a[0].heads == 4);
    CHECK(a[0].kv_heads == 2);
    CHECK(a[0].head_dim == 32);
    CHECK(a[0].forward_s == doctest::Approx(812.34e-6));
    CHECK(a[0].backward_s == doctest::Approx(1534.56e-6).epsilon(1e-4));
    CHECK(a[1].impl == "flash");
    CHECK(a[1].dtype == documents::DType::bf16);
    CHECK(a[1].seq == 4096);
    CHECK(a[1].kv_heads == 8);
    CHECK(a[1].forward_s == doctest::Approx(1.25e-3));
    CHECK(a[1].backward_s == doctest::Approx(3.5e-3));
  }
  // Without cores the section has no "attention".
  CHECK_FALSE(calibration_to_json(record()).contains("attention"));
}

TEST_CASE("profile_writer::merging replaces the attention cores when the new section has them") {
  auto r = record();
  r.attention = {{"eager", documents::DType::fp32, 2, 128, 4, 2, 32, 800e-6, 1500e-6}};
  const auto first = merge_calibration(core::read_json_file(kA100), calibration_to_json(r));
  // A later run without --attention-seq keeps them.
  const auto kept = merge_calibration(first, calibration_to_json(record()));
  REQUIRE(kept.at("calibration").at("attention").size() == 1);
  CHECK(kept.at("calibration").at("attention").at(0).at("forward_us") == 800);
  // A run with it replaces them.
  r.attention = {{"eager", documents::DType::fp32, 4, 64, 4, 2, 32, 300e-6, 600e-6},
                 {"eager", documents::DType::fp32, 1, 256, 4, 2, 32, 900e-6, 1800e-6}};
  const auto replaced = merge_calibration(kept, calibration_to_json(r));
  const auto hw = documents::hardware_from_json(replaced, "merged");
  REQUIRE(hw.calibration->attention.size() == 2);
  CHECK(hw.calibration->attention[0].seq == 64);
  CHECK(hw.calibration->attention[1].forward_s == doctest::Approx(900e-6));
}

TEST_CASE("profile_writer::a measured profile is complete and says what it measured") {
  const auto doc = measured_profile(system(), record());
  const auto hw = documents::hardware_from_json(doc, "test-cpu");
  CHECK(hw.device == "Test CPU");
  CHECK(hw.gpus_per_node == 4);
  CHECK(hw.memory_bytes == doctest::Approx(16.0 * (1u << 30)));
  CHECK(hw.peak(documents::DType::fp32) == doctest::Approx(100e9));
  CHECK(hw.compute_efficiency == doctest::Approx(0.8));
  // Links from the all_reduce curves: busbw = algbw · 2(n−1)/n, latency per ring step = α / 2(n−1).
  CHECK(hw.intra_bandwidth_Bps == doctest::Approx(30e9 * 2 * 3 / 4).epsilon(1e-4));
  CHECK(hw.intra_latency_s == doctest::Approx(4e-6 / 6).epsilon(1e-3));
  CHECK(hw.inter_bandwidth_Bps == doctest::Approx(10e9 * 2 * 7 / 8).epsilon(1e-4));
  CHECK(hw.inter_latency_s == doctest::Approx(20e-6 / 14).epsilon(1e-3));
  CHECK(hw.host_optimizer_params_per_s == doctest::Approx(0.5e9));
  CHECK(doc.at("gpu").at("source").get<std::string>().find(
            "measured by calibrate on 2025-01-31T12:00:00Z") == 0);
  REQUIRE(hw.calibration.has_value());
  CHECK(hw.calibration->collectives.size() == 3);
}

TEST_CASE("profile_writer::a CPU rank's profile is a CPU device without overheads") {
  auto s = system();
  s.cpu_device = true;
  const auto hw = documents::hardware_from_json(measured_profile(s, record()), "test-cpu");
  // The executor's CPU backend: collectives block compute, the tracked allocator has no pool.
  CHECK(hw.is_cpu);
  CHECK(hw.fragmentation == 0);
  CHECK(hw.cuda_context_bytes == 0);
  CHECK(hw.nccl_workspace_bytes == 0);
  // A GPU's overheads are planning defaults until the executor measures them.
  s.cpu_device = false;
  const auto doc = measured_profile(s, record());
  CHECK(!documents::hardware_from_json(doc, "test-gpu").is_cpu);
  CHECK(doc.at("overhead").at("source").get<std::string>().find("NOT MEASURED") == 0);
}

TEST_CASE("profile_writer::a tier without curves borrows the other's values and says so") {
  auto r = record();
  r.curves.erase(r.curves.begin());  // no inter-node curve
  const auto doc = measured_profile(system(), r);
  const auto hw = documents::hardware_from_json(doc, "x");
  CHECK(hw.inter_bandwidth_Bps == doctest::Approx(hw.intra_bandwidth_Bps));
  CHECK(doc.at("inter_node").at("source").get<std::string>().find("NOT MEASURED") !=
        std::string::npos);
  r.curves.clear();  // a one-rank run
  const auto alone = documents::hardware_from_json(measured_profile(system(), r), "y");
  CHECK(alone.intra_bandwidth_Bps == doctest::Approx(10e9));
  const auto link = link_from_curves(record().curves, Tier::intra_node);
  REQUIRE(link.has_value());
  CHECK(link->op == Collective::all_reduce);
  CHECK(link->ranks == 4);
}

TEST_CASE("profile_writer::a profile to merge into names --into and the file") {
  CHECK_THROWS_WITH_AS(read_profile_for_merge("/no/such/profile.json"),
                       doctest::Contains("--into: /no/such/profile.json"), core::InputError);
  CHECK(rounded(123.456789, 4) == doctest::Approx(123.5));
  CHECK(rounded(0.000123456, 3) == doctest::Approx(0.000123));
}
