// Hardware profiles (hardware_profiles/*.json): every preset loads, units are converted once at
// the parse boundary (GiB = 2^30, GB = 1e9, us = 1e-6 s, TFLOPs = 1e12 FLOP/s), and bad documents
// are rejected with one line naming the JSON pointer and the value.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>

#include "core/json_reader.hpp"
#include "documents/hardware.hpp"
#include "documents/model.hpp"
#include "tests/test_support.hpp"

using shardplan::test::error_of;
using namespace shardplan::core;
using namespace shardplan::documents;
using nlohmann::json;

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kMiB = 1024.0 * 1024.0;

json profile_doc(const std::string& name) {
  return read_json_file(data_dir() + "/hardware_profiles/" + name + ".json");
}

// A calibration section as `calibrate` writes it: one measured all-reduce curve, one GEMM.
json calibration_doc() {
  return json::parse(R"({
    "date": "2025-01-01T00:00:00Z",
    "backend": "nccl",
    "host": "node0",
    "library": "NCCL 2.21.5",
    "ranks": 8,
    "collectives": [{
      "op": "all_reduce", "ranks": 8, "tier": "intra_node",
      "segments": [
        {"min_bytes": 0, "max_bytes": 1048576, "latency_us": 20, "bandwidth_GBps": 50},
        {"min_bytes": 1048576, "max_bytes": 8589934592, "latency_us": 40, "bandwidth_GBps": 130}
      ],
      "samples": [{"size_bytes": 1048576, "time_us": 41}],
      "fit_error": {"median_rel": 0.02, "max_rel": 0.08}
    }],
    "gemm": [{"m": 8192, "n": 8192, "k": 8192, "dtype": "bf16", "time_us": 4000, "TFLOPs": 274.9}],
    "compute_efficiency": 0.85,
    "memory_bandwidth_GBps": 1800
  })");
}

}  // namespace

TEST_CASE("hardware::every preset loads") {
  const auto names = preset_hardware_names();
  for (const char* expected :
       {"a100-sxm4-40gb", "a100-sxm4-80gb", "h100-sxm5-80gb", "h200-sxm-141gb", "l40s-48gb"}) {
    CAPTURE(expected);
    CHECK(std::find(names.begin(), names.end(), expected) != names.end());
  }
  for (const auto& name : names) {
    CAPTURE(name);
    const auto p = load_hardware(name);
    CHECK(p.name == name);
    CHECK(p.memory_bytes > 0);
    CHECK(p.peak(DType::bf16) > p.peak(DType::fp32));
    CHECK(p.hbm_bandwidth_Bps > 0);
    CHECK(p.compute_efficiency > 0);
    CHECK(p.compute_efficiency <= 1);
    CHECK(p.gpus_per_node >= 1);
    CHECK(p.intra_bandwidth_Bps > p.inter_bandwidth_Bps);
    CHECK(p.host_memory_bytes > p.memory_bytes * p.gpus_per_node);
    CHECK_FALSE(p.calibration.has_value());
  }
}

TEST_CASE("hardware::units are converted at the boundary") {
  const auto p = load_hardware("a100-sxm4-80gb");
  CHECK(p.device == "NVIDIA A100-SXM4-80GB");
  CHECK(p.memory_bytes == 80.0 * kGiB);  // memory_GiB 80
  CHECK(p.peak(DType::bf16) == 312e12);  // peak_TFLOPs.bf16 312
  CHECK(p.peak(DType::fp32) == 19.5e12);
  CHECK(p.hbm_bandwidth_Bps == 2039e9);  // memory_bandwidth_GBps 2039
  CHECK(p.intra_bandwidth_Bps == 3e11);  // bandwidth_GBps 300
  CHECK(p.intra_latency_s == doctest::Approx(2e-6));
  CHECK(p.inter_bandwidth_Bps == 25e9);
  CHECK(p.inter_latency_s == doctest::Approx(6e-6));
  CHECK(p.host_memory_bytes == 2048.0 * kGiB);
  // DeepSpeed's CPUAdam at the ZeRO-Offload paper's rate, torch's AdamW at the measured fraction.
  CHECK(p.host_optimizer_rate("deepspeed") == 1e9);
  CHECK(p.host_optimizer_rate("torch") == 0.17e9);
  CHECK(p.cuda_context_bytes == 0.5 * kGiB);
  CHECK(p.fragmentation == 0.05);
}

TEST_CASE("hardware::device memory is what the driver reports") {
  // nvidia-smi memory.total in MiB, exactly: 40536, 81559, 143771, 46068.
  CHECK(load_hardware("a100-sxm4-40gb").memory_bytes == 40536 * kMiB);
  CHECK(load_hardware("h100-sxm5-80gb").memory_bytes == 81559 * kMiB);
  CHECK(load_hardware("h200-sxm-141gb").memory_bytes == 143771 * kMiB);
  CHECK(load_hardware("l40s-48gb").memory_bytes == 46068 * kMiB);
}

TEST_CASE("hardware::datasheet peaks and links") {
  const auto h100 = load_hardware("h100-sxm5-80gb");
  CHECK(h100.peak(DType::bf16) == 989.5e12);  // dense: half the datasheet's sparse 1979
  CHECK(h100.intra_bandwidth_Bps == 450e9);   // NVLink 4: 900 GB/s bidirectional
  CHECK(h100.inter_bandwidth_Bps == 50e9);    // 400 Gb/s NDR per GPU
  const auto h200 = load_hardware("h200-sxm-141gb");
  CHECK(h200.hbm_bandwidth_Bps == 4.8e12);
  CHECK(h200.peak(DType::bf16) == h100.peak(DType::bf16));
  const auto l40s = load_hardware("l40s-48gb");
  CHECK(l40s.intra_bandwidth_Bps == l40s.host_link_Bps);  // PCIe only, no NVLink
  CHECK(l40s.inter_bandwidth_Bps == 6.25e9);              // 2 x 200 Gb/s per 8 GPUs
  CHECK(l40s.peak(DType::tf32) == 183e12);
}

TEST_CASE("hardware::peak falls back bf16 -> fp16 -> fp32") {
  json doc = profile_doc("a100-sxm4-80gb");
  doc["gpu"]["peak_TFLOPs"] = {{"fp32", 19.5}, {"fp16", 312}};
  const auto p = hardware_from_json(doc, "x");
  CHECK(p.peak(DType::tf32) == 312e12);
  CHECK(p.peak(DType::bf16) == 312e12);
}

TEST_CASE("hardware::calibration is read with its units") {
  json doc = profile_doc("a100-sxm4-80gb");
  doc["calibration"] = calibration_doc();
  const auto p = hardware_from_json(doc, "cal");
  REQUIRE(p.calibration.has_value());
  const auto& c = *p.calibration;
  CHECK(c.backend == "nccl");
  CHECK(c.ranks == 8);
  REQUIRE(c.collectives.size() == 1);
  const auto& curve = c.collectives[0];
  CHECK(curve.op == Collective::all_reduce);
  CHECK(curve.tier == Tier::intra_node);
  CHECK(curve.segments[1].bandwidth_Bps == 130e9);
  CHECK(curve.segments[1].latency_s == doctest::Approx(40e-6));
  // 1 GB on the second segment: 40 us + 1e9 / 130e9 s.
  CHECK(curve.time_s(1e9) == doctest::Approx(40e-6 + 1e9 / 130e9));
  // Below the first segment's max: the first line.
  CHECK(curve.time_s(1024) == doctest::Approx(20e-6 + 1024 / 50e9));
  REQUIRE(c.gemm.size() == 1);
  CHECK(c.gemm[0].flops_per_s() == doctest::Approx(2.0 * 8192.0 * 8192.0 * 8192.0 / 4e-3));
  CHECK(c.compute_efficiency.value() == 0.85);
  CHECK(c.memory_bandwidth_Bps.value() == 1800e9);
  CHECK(hardware_to_json(p)["calibrated"] == true);
}

// ----------------------------------------------------------------------------------------------
// Rejections.

TEST_CASE("hardware::negative memory") {
  json doc = profile_doc("a100-sxm4-80gb");
  doc["gpu"]["memory_GiB"] = -8;
  CHECK(error_of([&] { hardware_from_json(doc, "x"); }) == "/gpu/memory_GiB: must be > 0, got -8");
  json bw = profile_doc("h100-sxm5-80gb");
  bw["inter_node"]["bandwidth_GBps_per_gpu"] = -50;
  CHECK(error_of([&] { hardware_from_json(bw, "x"); }) ==
        "/inter_node/bandwidth_GBps_per_gpu: must be > 0, got -50");
}

TEST_CASE("hardware::inter-node bandwidth names its unit") {
  // a100-pcie-40gb: 4 x 200 Gb/s HDR per node = 100 GB/s per node each way; 8 GPUs share it,
  // 12.5 GB/s each.
  const auto pcie = hardware_from_json(profile_doc("a100-pcie-40gb"), "x");
  CHECK(pcie.inter_bandwidth_Bps == doctest::Approx(12.5e9));
  CHECK(pcie.inter_bandwidth_per_node_key);
  // DGX A100: one 200 Gb/s HDR adapter per GPU = 25 GB/s per GPU.
  const auto dgx = hardware_from_json(profile_doc("a100-sxm4-80gb"), "x");
  CHECK(dgx.inter_bandwidth_Bps == doctest::Approx(25e9));
  CHECK_FALSE(dgx.inter_bandwidth_per_node_key);

  json old = profile_doc("a100-sxm4-80gb");
  old["inter_node"]["bandwidth_GBps"] = 12.5;
  old["inter_node"].erase("bandwidth_GBps_per_gpu");
  CHECK(error_of([&] { hardware_from_json(old, "x"); }) ==
        "/inter_node/bandwidth_GBps: the unit is ambiguous, got 12.5: rename it "
        "bandwidth_GBps_per_gpu (its old meaning: each GPU's share of the node's NICs) or give "
        "bandwidth_GBps_per_node");
  json both = profile_doc("a100-sxm4-80gb");
  both["inter_node"]["bandwidth_GBps_per_node"] = 200;
  CHECK(error_of([&] { hardware_from_json(both, "x"); }) ==
        "/inter_node/bandwidth_GBps_per_node: give bandwidth_GBps_per_gpu or "
        "bandwidth_GBps_per_node, not both");
  json neither = profile_doc("a100-sxm4-80gb");
  neither["inter_node"].erase("bandwidth_GBps_per_gpu");
  CHECK(error_of([&] { hardware_from_json(neither, "x"); }) ==
        "/inter_node/bandwidth_GBps_per_gpu: missing key (or give bandwidth_GBps_per_node)");
  json zero = profile_doc("a100-pcie-40gb");
  zero["inter_node"]["bandwidth_GBps_per_node"] = 0;
  CHECK(error_of([&] { hardware_from_json(zero, "x"); }) ==
        "/inter_node/bandwidth_GBps_per_node: must be > 0, got 0");
}

TEST_CASE("hardware::unknown key") {
  json doc = profile_doc("a100-sxm4-80gb");
  doc["gpu"]["memroy_GiB"] = 80;
  CHECK(error_of([&] { hardware_from_json(doc, "x"); }) == "/gpu/memroy_GiB: unknown key");
  json top = profile_doc("l40s-48gb");
  top["nvlink"] = false;
  CHECK(error_of([&] { hardware_from_json(top, "x"); }) == "/nvlink: unknown key");
}

TEST_CASE("hardware::missing section") {
  json doc = profile_doc("a100-sxm4-80gb");
  doc.erase("host");
  CHECK(error_of([&] { hardware_from_json(doc, "x"); }) == "/host: missing key");
  json fp32 = profile_doc("a100-sxm4-80gb");
  fp32["gpu"]["peak_TFLOPs"].erase("fp32");
  CHECK(error_of([&] { hardware_from_json(fp32, "x"); }) == "/gpu/peak_TFLOPs/fp32: missing key");
}

// FP8 tensor cores: the H100 SXM datasheet's FP8 3,958 TFLOPS is with sparsity, dense 1,979; the
// A100 has none (its profile names no fp8 peak); a peak must be positive.
TEST_CASE("hardware::fp8 peak") {
  CHECK(load_hardware("h100-sxm5-80gb").fp8_peak_flops == 1979e12);
  CHECK(load_hardware("a100-sxm4-80gb").fp8_peak_flops == 0);
  json doc = profile_doc("h100-sxm5-80gb");
  doc["gpu"]["peak_TFLOPs"]["fp8"] = -1;
  CHECK(error_of([&] { hardware_from_json(doc, "x"); }).starts_with("/gpu/peak_TFLOPs/fp8: "));
}

TEST_CASE("hardware::wrong schema_version") {
  json doc = profile_doc("a100-sxm4-80gb");
  doc["schema_version"] = 2;
  CHECK(error_of([&] { hardware_from_json(doc, "x"); }) == "/schema_version: must be 1, got 2");
  doc["schema_version"] = "1";
  CHECK(error_of([&] { hardware_from_json(doc, "x"); }) ==
        "/schema_version: must be an integer, got \"1\"");
}

TEST_CASE("hardware::bad calibration entry") {
  json doc = profile_doc("a100-sxm4-80gb");
  doc["calibration"] = calibration_doc();
  doc["calibration"]["collectives"][0]["op"] = "all_reduse";
  CHECK(error_of([&] { hardware_from_json(doc, "x"); }) ==
        "/calibration/collectives/0/op: unknown collective \"all_reduse\"");
  json seg = profile_doc("a100-sxm4-80gb");
  seg["calibration"] = calibration_doc();
  seg["calibration"]["collectives"][0]["segments"][1]["bandwidth_GBps"] = 0;
  CHECK(error_of([&] { hardware_from_json(seg, "x"); }) ==
        "/calibration/collectives/0/segments/1/bandwidth_GBps: must be > 0, got 0");
  json tier = profile_doc("a100-sxm4-80gb");
  tier["calibration"] = calibration_doc();
  tier["calibration"]["collectives"][0]["tier"] = "rack";
  CHECK(error_of([&] { hardware_from_json(tier, "x"); }) ==
        "/calibration/collectives/0/tier: must be intra_node or inter_node, got \"rack\"");
}

TEST_CASE("hardware::host costs beyond a second are refused") {
  json doc = profile_doc("a100-sxm4-80gb");
  doc["framework"]["op_dispatch_us"] = 1e300;
  CHECK(error_of([&] { hardware_from_json(doc, "x"); }).rfind("/framework/op_dispatch_us: ", 0) ==
        0);
  doc = profile_doc("a100-sxm4-80gb");
  doc["framework"]["flavours"]["ddp"]["backward_unit_us"] = 2e6;
  CHECK(error_of([&] {
          hardware_from_json(doc, "x");
        }).rfind("/framework/flavours/ddp/backward_unit_us: ", 0) == 0);
}

TEST_CASE("hardware::unknown profile names the presets") {
  const auto e = error_of([] { load_hardware("tpu-v5"); });
  CHECK(e.rfind("--hardware: \"tpu-v5\" is neither a profile (a100-pcie-40gb, ", 0) == 0);
  // Something on disk that is not a profile's name is read as a file, which says what it is.
  CHECK(error_of([] { load_hardware("/dev/zero"); }) ==
        "/dev/zero: is a character device, not a regular file");
}

TEST_CASE("hardware::a CPU profile's collectives block unless it says they overlap") {
  json doc =
      read_json_file(std::string(SHARDPLAN_SOURCE_DIR) + "/tests/executor/data/cpu-test.json");
  CHECK(hardware_from_json(doc, "x").collectives_block);
  doc["gpu"]["collectives"] = "overlapped";
  CHECK_FALSE(hardware_from_json(doc, "x").collectives_block);
  doc["gpu"]["collectives"] = "blocking";
  CHECK(hardware_from_json(doc, "x").collectives_block);
  CHECK_FALSE(hardware_from_json(profile_doc("h100-sxm5-80gb"), "x").collectives_block);
}

TEST_CASE(
    "hardware::a straggler wait is read, checked, and scaled by the expected slowest of n ranks") {
  json doc =
      read_json_file(std::string(SHARDPLAN_SOURCE_DIR) + "/tests/executor/data/cpu-test.json");
  doc["calibration"] = calibration_doc();
  CHECK(hardware_from_json(doc, "x").straggler_wait_fraction(2) == 0);  // not measured
  doc["calibration"]["straggler_wait"] = {
      {"fraction", 0.05}, {"ranks", 2}, {"segment_us", 1500}, {"repetitions", 40}};
  const auto p = hardware_from_json(doc, "x");
  CHECK(p.straggler_wait_fraction(1) == 0);  // one rank waits for nobody
  CHECK(p.straggler_wait_fraction(2) == doctest::Approx(0.05));
  // The slowest of n ranks lies E[max of n standard normals] deviations above the mean: 1/√π =
  // 0.56419 for 2, 1.02938 for 4 (Harter 1961, Table 1), 3.2414 for 1000 (Tippett 1925, "On the
  // extreme individuals and the range of samples taken from a normal population", Biometrika 17).
  CHECK(p.straggler_wait_fraction(4) == doctest::Approx(0.05 * 1.02938 / 0.56419));
  CHECK(p.straggler_wait_fraction(1000) == doctest::Approx(0.05 * 3.2414 / 0.56419).epsilon(0.01));
  json bad = doc;
  bad["calibration"]["straggler_wait"]["ranks"] = 1;
  CHECK(error_of([&] { hardware_from_json(bad, "x"); }) ==
        "/calibration/straggler_wait/ranks: must be >= 2, got 1");
  bad = doc;
  bad["calibration"]["straggler_wait"]["fraction"] = -0.1;
  CHECK(error_of([&] {
          hardware_from_json(bad, "x");
        }).rfind("/calibration/straggler_wait/fraction: ", 0) == 0);
  bad = doc;
  bad["calibration"]["straggler_wait"]["spread"] = 1;
  CHECK(error_of([&] { hardware_from_json(bad, "x"); }) ==
        "/calibration/straggler_wait/spread: unknown key");
}

TEST_CASE("hardware::collectives must be blocking or overlapped, and a GPU's never block") {
  json doc =
      read_json_file(std::string(SHARDPLAN_SOURCE_DIR) + "/tests/executor/data/cpu-test.json");
  doc["gpu"]["collectives"] = "async";
  CHECK(error_of([&] { hardware_from_json(doc, "x"); }) ==
        "/gpu/collectives: must be blocking or overlapped, got \"async\"");
  json gpu = profile_doc("a100-sxm4-80gb");
  gpu["gpu"]["collectives"] = "blocking";
  CHECK(error_of([&] { hardware_from_json(gpu, "x"); }) ==
        "/gpu/collectives: a GPU's collectives run on their own streams: only a cpu kind blocks");
}

TEST_CASE("hardware::clocks, SMs and memory efficiency are read, and their rejections") {
  json doc = profile_doc("h100-sxm5-80gb");
  const auto p = hardware_from_json(doc, "x");
  CHECK(p.sm_count == 132);
  CHECK(p.clock_ratio() == doctest::Approx(doc["gpu"]["clock_MHz"]["sustained"].get<double>() /
                                           doc["gpu"]["clock_MHz"]["boost"].get<double>()));
  doc["gpu"]["clock_MHz"]["sustained"] = 2000;
  doc["gpu"]["clock_MHz"]["boost"] = 1980;
  CHECK(error_of([&] { hardware_from_json(doc, "x"); }) ==
        "/gpu/clock_MHz/sustained: must be <= boost 1980 (the peak is at boost), got 2000");
  doc = profile_doc("h100-sxm5-80gb");
  doc["gpu"]["memory_bandwidth_efficiency"] = 1.5;
  CHECK(error_of([&] {
          hardware_from_json(doc, "x");
        }).rfind("/gpu/memory_bandwidth_efficiency: ", 0) == 0);
  doc = profile_doc("h100-sxm5-80gb");
  doc["gpu"]["sm_count"] = 0;
  CHECK(error_of([&] { hardware_from_json(doc, "x"); }).rfind("/gpu/sm_count: ", 0) == 0);
}

TEST_CASE("hardware::framework overheads and per-framework optimizer rates, and their rejections") {
  json doc = profile_doc("a100-sxm4-80gb");
  doc["framework"] =
      json::parse(R"({"op_dispatch_us": 5, "flavours": {"fsdp2": {"forward_unit_us": 100,
    "backward_unit_us": 200, "forward_tensor_us": 1, "backward_tensor_us": 2}}, "source": "s"})");
  doc["host"]["optimizer_Gparams_per_s"] = {{"deepspeed", 2}, {"torch", 0.5}};
  auto p = hardware_from_json(doc, "x");
  CHECK(p.op_dispatch_s == doctest::Approx(5e-6));
  CHECK(p.framework.at("fsdp2").backward_unit_s == doctest::Approx(200e-6));
  CHECK(!p.framework.contains("ddp"));
  CHECK(p.host_optimizer_rate("deepspeed") == 2e9);
  CHECK(p.host_optimizer_rate("torch") == 0.5e9);
  doc["framework"]["flavours"]["megatron"] = doc["framework"]["flavours"]["fsdp2"];
  CHECK(error_of([&] { hardware_from_json(doc, "x"); }) ==
        "/framework/flavours/megatron: unknown key");
  doc["framework"]["flavours"].erase("megatron");
  doc["framework"]["flavours"]["fsdp2"]["forward_unit_us"] = -1;
  CHECK(error_of([&] {
          hardware_from_json(doc, "x");
        }).rfind("/framework/flavours/fsdp2/forward_unit_us: ", 0) == 0);
  doc = profile_doc("a100-sxm4-80gb");
  doc["host"]["optimizer_Gparams_per_s"] = {{"deepspeed", 2}};
  CHECK(error_of([&] { hardware_from_json(doc, "x"); }) ==
        "/host/optimizer_Gparams_per_s/torch: missing key");
}

TEST_CASE("hardware::calibrated attention samples, and their rejections") {
  json doc = profile_doc("a100-sxm4-80gb");
  doc["calibration"] = calibration_doc();
  doc["calibration"]["attention"] = json::parse(R"([{"impl": "eager", "dtype": "fp32", "batch": 2,
    "seq": 128, "heads": 4, "kv_heads": 2, "head_dim": 32, "forward_us": 100, "backward_us": 250}])");
  const auto p = hardware_from_json(doc, "x");
  REQUIRE(p.calibration->attention.size() == 1);
  CHECK(p.calibration->attention[0].backward_s == doctest::Approx(250e-6));
  doc["calibration"]["attention"][0]["kv_heads"] = 3;
  CHECK(error_of([&] { hardware_from_json(doc, "x"); }) ==
        "/calibration/attention/0/kv_heads: must divide heads 4, got 3");
  doc["calibration"]["attention"][0]["kv_heads"] = 2;
  doc["calibration"]["attention"][0]["impl"] = "sdpa";
  CHECK(error_of([&] {
          hardware_from_json(doc, "x");
        }).rfind("/calibration/attention/0/impl: ", 0) == 0);
}

TEST_CASE("hardware::every profile's framework overheads are the measured corpus's") {
  // tests/costmodel/data/oracle_overheads.json: the frameworks' own code timed by
  // validation/measure_overheads.py. Each shipped profile carries its fits (to 1 ns) and splits its
  // host optimizer rate by the measured torch AdamW / DeepSpeed CPUAdam ratio.
  const json corpus = read_json_file(std::string(SHARDPLAN_SOURCE_DIR) +
                                     "/tests/costmodel/data/oracle_overheads.json");
  const json& f = corpus["flavours"];
  const json& ds = f["deepspeed"]["fit_with_submodules"];
  const double ratio =
      corpus["host_optimizer"]["torch_adamw_foreach_false"]["Gparams_per_s"].get<double>() /
      corpus["host_optimizer"]["deepspeed_cpu_adam"]["Gparams_per_s"].get<double>();
  auto us = [](const json& v) { return v.get<double>() * 1e-6; };
  for (const auto& name : preset_hardware_names()) {
    CAPTURE(name);
    const auto p = load_hardware(name);
    if (p.is_cpu) continue;
    CHECK(p.op_dispatch_s == doctest::Approx(us(corpus["op_dispatch_autograd_us"])).epsilon(1e-3));
    for (const char* fl : {"ddp", "fsdp1", "fsdp2", "deepspeed_zero12"}) {
      CAPTURE(fl);
      const auto& o = p.framework.at(fl);
      CHECK(o.forward_unit_s == doctest::Approx(us(f[fl]["forward_unit_us"])).epsilon(1e-3));
      CHECK(o.backward_unit_s == doctest::Approx(us(f[fl]["backward_unit_us"])).epsilon(1e-3));
      CHECK(o.forward_tensor_s == doctest::Approx(us(f[fl]["forward_tensor_us"])).epsilon(1e-3));
      CHECK(o.backward_tensor_s == doctest::Approx(us(f[fl]["backward_tensor_us"])).epsilon(1e-3));
    }
    const auto& z3 = p.framework.at("deepspeed_zero3");
    CHECK(z3.forward_unit_s ==
          doctest::Approx(us(ds["forward"]["coefficients_us"]["unit"])).epsilon(1e-3));
    CHECK(z3.forward_submodule_s ==
          doctest::Approx(us(ds["forward"]["coefficients_us"]["submodule"])).epsilon(1e-3));
    CHECK(z3.backward_tensor_s ==
          doctest::Approx(us(ds["backward"]["coefficients_us"]["tensor"])).epsilon(1e-3));
    CHECK(p.host_optimizer_rate("torch") / p.host_optimizer_rate("deepspeed") ==
          doctest::Approx(ratio).epsilon(5e-3));
  }
}

// A curve's fit carries the goal calibrate set for it: one beyond its goal is said to miss it
// (the planner's note), one within it or without a goal is not; a goal that is not a positive
// number is refused, named by its pointer.
TEST_CASE("hardware::a fit's goal is read and judged") {
  json doc = profile_doc("a100-sxm4-80gb");
  doc["calibration"] = calibration_doc();
  auto& fit = doc["calibration"]["collectives"][0]["fit_error"];
  CHECK_FALSE(hardware_from_json(doc, "p").calibration->collectives[0].misses_goal());  // no goal
  fit["goal_median_rel"] = 0.05;
  fit["goal_max_rel"] = 0.1;
  CHECK_FALSE(hardware_from_json(doc, "p").calibration->collectives[0].misses_goal());
  fit["max_rel"] = 0.3;
  const auto poor = hardware_from_json(doc, "p");
  CHECK(poor.calibration->collectives[0].misses_goal());
  CHECK(*poor.calibration->collectives[0].goal_max_rel_error == 0.1);
  fit["goal_max_rel"] = 0;
  CHECK(shardplan::test::error_of([&] {
          hardware_from_json(doc, "p");
        }).starts_with("/calibration/collectives/0/fit_error/goal_max_rel: "));
  fit["goal_max_rel"] = "0.1";
  CHECK(shardplan::test::error_of([&] {
          hardware_from_json(doc, "p");
        }).starts_with("/calibration/collectives/0/fit_error/goal_max_rel: "));
}
