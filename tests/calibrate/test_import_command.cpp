#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <sstream>
#include <string>

#include <fmt/format.h>

#include "calibrate/import_command.hpp"
#include "core/input_error.hpp"
#include "core/json_reader.hpp"
#include "documents/hardware.hpp"

using namespace shardplan;
using namespace shardplan::calibrate;

namespace {
const std::string kSource = SHARDPLAN_SOURCE_DIR;
const std::string kExamples = kSource + "/examples/nccl-tests/";

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          fmt::format("calibrate-import-{}-{}", getpid(), name))
      .string();
}
}  // namespace

TEST_CASE("import::the sample logs merged into a profile meet the fit goals") {
  ImportOptions o;
  o.logs = {kExamples + "all_reduce_perf-8xA100.log", kExamples + "all_gather_perf-8xA100.log",
            kExamples + "reduce_scatter_perf-8xA100.log",
            kExamples + "all_reduce_perf-2x8xA100-ib.log"};
  o.into = kSource + "/hardware_profiles/a100-sxm4-80gb.json";
  o.out = temp_path("a100.json");
  std::ostringstream out, notes;
  CHECK(run_import(o, out, notes) == 0);
  const auto hw = documents::load_hardware(o.out);
  REQUIRE(hw.calibration.has_value());
  const auto& c = *hw.calibration;
  CHECK(c.backend == "nccl");
  CHECK(c.library == "NCCL 2.19.3");
  CHECK(c.host == "dgx-a01,dgx-a02");
  CHECK(c.ranks == 16);
  REQUIRE(c.collectives.size() == 4);
  for (const auto& curve : c.collectives) {
    CAPTURE(documents::traits(curve.op).name);
    CHECK(curve.median_rel_error <= 0.05);
    CHECK(curve.max_rel_error <= 0.10);
    CHECK(curve.ranks == (curve.tier == documents::Tier::inter_node ? 16 : 8));
  }
  CHECK(notes.str().find(
            "# all_reduce, 16 ranks, inter_node (from all_reduce_perf-2x8xA100-ib.log):") !=
        std::string::npos);
  CHECK(out.str().empty());  // the profile went to --out
  std::filesystem::remove(o.out);
}

TEST_CASE("import::without --into the calibration section is written alone") {
  ImportOptions o;
  o.logs = {kExamples + "all_gather_perf-8xA100.log"};
  std::ostringstream out, notes;
  CHECK(run_import(o, out, notes) == 0);
  // Standard output is the document alone (it pipes into a JSON reader); the fit goes to notes.
  const auto doc = core::parse_json_text(out.str(), "stdout");
  CHECK(doc.at("calibration").at("collectives").at(0).at("op") == "all_gather");
  CHECK(doc.at("schema_version") == 1);
  CHECK(notes.str().rfind("# all_gather, 8 ranks, intra_node", 0) == 0);
}

TEST_CASE("import::-o - writes the document to standard output, merged or alone") {
  ImportOptions o;
  o.logs = {kExamples + "all_gather_perf-8xA100.log"};
  o.out = "-";
  std::ostringstream out, notes;
  CHECK(run_import(o, out, notes) == 0);
  CHECK(core::parse_json_text(out.str(), "stdout").at("schema_version") == 1);
  CHECK_FALSE(std::filesystem::exists("-"));
  // With --into the merged profile goes to standard output; the profile is not touched.
  const std::string preset = kSource + "/hardware_profiles/a100-sxm4-80gb.json";
  const auto before = std::filesystem::last_write_time(preset);
  o.into = preset;
  std::ostringstream merged, merged_notes;
  CHECK(run_import(o, merged, merged_notes) == 0);
  const auto doc = core::parse_json_text(merged.str(), "stdout");
  CHECK(doc.at("calibration").at("collectives").at(0).at("op") == "all_gather");
  CHECK(doc.contains("gpu"));
  CHECK(std::filesystem::last_write_time(preset) == before);
}

TEST_CASE("import::flags that contradict a log, and missing facts, are bad input") {
  ImportOptions o;
  o.logs = {kExamples + "all_reduce_perf-2x8xA100-ib.log"};
  std::ostringstream out, notes;
  o.ranks = 8;
  CHECK_THROWS_WITH_AS(run_import(o, out, notes), doctest::Contains("--ranks: 8 but"),
                       core::InputError);
  o.ranks.reset();
  o.tier = documents::Tier::intra_node;
  CHECK_THROWS_WITH_AS(run_import(o, out, notes), doctest::Contains("--tier: intra_node but"),
                       core::InputError);
  o.tier.reset();
  o.op = documents::Collective::all_gather;
  CHECK_THROWS_WITH_AS(run_import(o, out, notes), doctest::Contains("--op: all_gather but"),
                       core::InputError);
  o.op.reset();
  o.into = temp_path("missing.json");
  CHECK_THROWS_WITH_AS(run_import(o, out, notes), doctest::Contains("--into:"), core::InputError);
}
