#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <fmt/format.h>

#include "calibrate/overheads_import.hpp"
#include "core/json_reader.hpp"
#include "documents/hardware.hpp"
#include "tests/test_support.hpp"

using namespace shardplan;
using namespace shardplan::calibrate;
using nlohmann::json;
using test::contains;
using test::error_of;

namespace {
const std::string kSource = SHARDPLAN_SOURCE_DIR;
// validation/measure_overheads.py's output on a 2-core AMD EPYC host with torch 2.15.0 and
// DeepSpeed 0.19.8: the frameworks' own hooks timed, the corpus the shipped profiles were made
// from.
const std::string kCorpus = kSource + "/tests/costmodel/data/oracle_overheads.json";

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          fmt::format("calibrate-overheads-{}-{}", getpid(), name))
      .string();
}

std::string file_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}
}  // namespace

TEST_CASE(
    "overheads_import::the measured corpus gives each flavour's fit and the host optimizer rates") {
  const json corpus = core::read_json_file(kCorpus);
  const MeasuredOverheads m = overheads_from_measurement(corpus);
  // The numbers as the corpus records them (its flavours' fits, in microseconds).
  CHECK(m.framework["op_dispatch_us"].get<double>() == doctest::Approx(2.133));
  CHECK(m.framework["flavours"]["fsdp2"]["forward_unit_us"].get<double>() ==
        doctest::Approx(156.223));
  CHECK(m.framework["flavours"]["fsdp2"]["backward_tensor_us"].get<double>() ==
        doctest::Approx(19.747));
  CHECK(m.framework["flavours"]["ddp"]["backward_tensor_us"].get<double>() ==
        doctest::Approx(4.438));
  // ZeRO-3 from DeepSpeed's fit with a term per submodule.
  CHECK(m.framework["flavours"]["deepspeed_zero3"]["forward_submodule_us"].get<double>() ==
        doctest::Approx(134.286));
  CHECK(m.framework["flavours"]["deepspeed_zero3"]["backward_unit_us"].get<double>() ==
        doctest::Approx(76.732));
  REQUIRE(m.host_optimizer_Gparams_per_s.has_value());
  CHECK((*m.host_optimizer_Gparams_per_s)["deepspeed"].get<double>() == doctest::Approx(2.2374));
  CHECK((*m.host_optimizer_Gparams_per_s)["torch"].get<double>() == doctest::Approx(0.3795));
  CHECK(contains(m.framework["source"].get<std::string>(), "torch 2.15.0+cu132, deepspeed 0.19.8"));
}

TEST_CASE("overheads_import::merged into a profile, the cost model reads the measured overheads") {
  const std::string into = kSource + "/hardware_profiles/a100-sxm4-80gb.json";
  const std::string out_path = temp_path("a100.json");
  std::ostringstream out;
  CHECK(run_import_overheads({kCorpus, into, out_path}, out) == 0);
  const auto hw = documents::load_hardware(out_path);
  CHECK(hw.framework.at("fsdp1").forward_unit_s == doctest::Approx(150.632e-6));
  CHECK(hw.framework.at("deepspeed_zero12").backward_tensor_s == doctest::Approx(38.721e-6));
  // Measured on this host, so the rates are the measured ones, not the profile's scaled ones.
  CHECK(hw.host_optimizer_rate("deepspeed") == doctest::Approx(2.2374e9));
  CHECK(hw.host_optimizer_rate("torch") == doctest::Approx(0.3795e9));
  CHECK(contains(out.str(), "fsdp2"));
  std::filesystem::remove(out_path);
}

TEST_CASE("overheads_import::a flavour whose run failed keeps the profile's values, and says so") {
  json corpus = core::read_json_file(kCorpus);
  corpus["flavours"]["fsdp1"] = {{"error", "RuntimeError: no backend"}};
  const json profile = core::read_json_file(kSource + "/hardware_profiles/a100-sxm4-80gb.json");
  const json merged = merge_overheads(profile, overheads_from_measurement(corpus));
  CHECK(merged["framework"]["flavours"]["fsdp1"] == profile["framework"]["flavours"]["fsdp1"]);
  CHECK(contains(merged["framework"]["source"].get<std::string>(), "fsdp1 kept from the profile"));
}

TEST_CASE("overheads_import::rejections name the field and the value") {
  const json corpus = core::read_json_file(kCorpus);
  json bad = corpus;
  bad["generated_by"] = "nccl-tests";
  CHECK(error_of([&] { overheads_from_measurement(bad); }) ==
        "/generated_by: must be \"validation/measure_overheads.py\", got \"nccl-tests\"");
  bad = corpus;
  bad["schema_version"] = 2;
  CHECK(error_of([&] { overheads_from_measurement(bad); }) == "/schema_version: must be 1, got 2");
  bad = corpus;
  bad["flavours"]["fsdp2"]["forward_tensor_us"] = -3.5;  // a fit that noise pushed below zero
  CHECK(contains(error_of([&] { overheads_from_measurement(bad); }),
                 "/flavours/fsdp2/forward_tensor_us: "));
  CHECK(contains(error_of([&] { overheads_from_measurement(bad); }), "-3.5"));
  bad = corpus;
  bad.erase("op_dispatch_autograd_us");
  CHECK(contains(error_of([&] { overheads_from_measurement(bad); }), "/op_dispatch_autograd_us: "));
  bad = corpus;
  bad["host_optimizer"]["torch_adamw_foreach_false"]["Gparams_per_s"] = 0;
  CHECK(contains(error_of([&] { overheads_from_measurement(bad); }),
                 "/host_optimizer/torch_adamw_foreach_false/Gparams_per_s: "));
  CHECK(contains(error_of([&] { overheads_from_measurement(json::array()); }),
                 "must be a JSON object"));
  // No time beyond the run that measured it (elapsed_s, 459 s here), no host optimizer faster
  // than a host's memory can feed.
  bad = corpus;
  bad["flavours"]["ddp"]["backward_unit_us"] = 1e300;
  CHECK(contains(error_of([&] { overheads_from_measurement(bad); }),
                 "/flavours/ddp/backward_unit_us: "));
  bad["flavours"]["ddp"]["backward_unit_us"] = 460e6;  // 460 s
  CHECK(contains(error_of([&] { overheads_from_measurement(bad); }),
                 "/flavours/ddp/backward_unit_us: "));
  bad = corpus;
  bad["host_optimizer"]["deepspeed_cpu_adam"]["Gparams_per_s"] = 1e9;
  CHECK(contains(error_of([&] { overheads_from_measurement(bad); }),
                 "/host_optimizer/deepspeed_cpu_adam/Gparams_per_s: "));
}

TEST_CASE("overheads_import::what the profile refuses is blamed on the measurement") {
  // 2 s per DDP unit is within the measuring run's 459 s but not a host cost a profile takes
  // (documents/hardware.cpp: a second at most): the message names the measurement's file.
  json corpus = core::read_json_file(kCorpus);
  corpus["flavours"]["ddp"]["backward_unit_us"] = 2e6;
  const std::string measurement = temp_path("slow-unit.json");
  std::ofstream(measurement) << corpus.dump();
  const std::string out_path = temp_path("merged.json");
  std::ostringstream out;
  const std::string e = error_of([&] {
    run_import_overheads(
        {measurement, kSource + "/hardware_profiles/a100-sxm4-80gb.json", out_path}, out);
  });
  CHECK(e.rfind(measurement + ": merged into ", 0) == 0);
  CHECK(contains(e, "/framework/flavours/ddp/backward_unit_us: "));
  CHECK_FALSE(std::filesystem::exists(out_path));
  std::filesystem::remove(measurement);
}

TEST_CASE("overheads_import::a bad measurement leaves the profile as it was") {
  const std::string into = temp_path("in-place.json");
  std::filesystem::copy_file(kSource + "/hardware_profiles/a100-sxm4-80gb.json", into,
                             std::filesystem::copy_options::overwrite_existing);
  const std::string before = file_text(into);
  const std::string bad = temp_path("bad.json");
  std::ofstream(bad)
      << R"({"generated_by": "validation/measure_overheads.py", "schema_version": 1})";
  std::ostringstream out;
  CHECK(contains(error_of([&] {
                   run_import_overheads({bad, into, ""}, out);
                 }),
                 "/op_dispatch_autograd_us"));
  CHECK(file_text(into) == before);
  std::filesystem::remove(into);
  std::filesystem::remove(bad);
}
