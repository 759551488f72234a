// Every JSON document the planner prints or writes names its format's version (schema_version),
// so that a reader can refuse one it does not know.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_fixture.hpp"
#include "core/input_error.hpp"
#include "core/json_reader.hpp"
#include "documents/plan.hpp"

using shardplan::planner::testing::planner;

namespace {

nlohmann::json printed(const std::vector<std::string>& args) {
  const auto r = planner(args);
  REQUIRE_MESSAGE(r.code == 0, r.err);
  return nlohmann::json::parse(r.out);
}

const std::vector<std::string> kJob = {"--model", "gpt2", "--hardware", "h100-sxm5-80gb",
                                       "--gpus",  "8",    "--seq-len",  "1024"};

std::vector<std::string> with(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

}  // namespace

TEST_CASE("json_outputs::estimate, recommend, describe and validate print schema_version") {
  // Version 2 of the estimate: one document for every layout (parallelism and stages[]).
  CHECK(printed(with({"estimate", "--strategy", "zero3", "--format", "json"}, kJob))
            .at("schema_version") == 2);
  const auto recommendation = printed(with({"recommend", "--format", "json"}, kJob));
  CHECK(recommendation.at("schema_version") == 2);
  // The candidates inside it are the recommendation document's, not documents of their own.
  CHECK_FALSE(recommendation.at("recommendation").contains("schema_version"));
  CHECK(printed(with({"recommend", "--emit", "plan"}, kJob)).at("schema_version") == 1);
  CHECK(printed({"describe", "--model", "gpt2", "--format", "json"}).at("schema_version") == 1);
  const std::string dir = std::string(SHARDPLAN_SOURCE_DIR) + "/tests/planner/data/cpu_run/";
  CHECK(printed({"validate", "--plan", dir + "plan.json", "--run", dir + "run.json", "--format",
                 "json"})
            .at("schema_version") == 1);
}

TEST_CASE("json_outputs::each plan that compare prints carries schema_version") {
  const auto plans =
      printed(with({"compare", "--strategy", "ddp,zero3", "--format", "json"}, kJob));
  REQUIRE(plans.is_array());
  REQUIRE(plans.size() == 2);
  for (const auto& plan : plans) CHECK(plan.at("schema_version") == 2);
}

TEST_CASE("json_outputs::the --trace file carries schema_version") {
  const auto path = std::filesystem::temp_directory_path() / "json-outputs-trace.json";
  REQUIRE(planner(with({"simulate", "--strategy", "zero3", "--trace", path.string()}, kJob)).code ==
          0);
  const auto trace = shardplan::core::read_json_file(path.string());
  std::filesystem::remove(path);
  CHECK(trace.at("schema_version") == 1);
  CHECK(trace.at("traceEvents").is_array());
}

TEST_CASE("json_outputs::--emit plan carries --gpu-memory-GiB to the executor") {
  // The size the plan was made to fit is the plan's capacity; the profile's size is not written.
  const auto plan = printed(with({"recommend", "--emit", "plan", "--gpu-memory-GiB", "40"}, kJob));
  CHECK(plan.at("capacity").at("gpu_memory_GiB") == 40.0);
  CHECK(shardplan::documents::plan_from_json(plan).gpu_memory_GiB == 40.0);
  const auto plain = printed(with({"recommend", "--emit", "plan"}, kJob));
  CHECK_FALSE(plain.contains("capacity"));
  CHECK_FALSE(shardplan::documents::plan_from_json(plain).gpu_memory_GiB.has_value());
  // What the executor would refuse to behave like: no size, or one past a million GiB.
  for (const double bad : {0.0, -2.0, 2e6}) {
    auto doc = plan;
    doc["capacity"]["gpu_memory_GiB"] = bad;
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(shardplan::documents::plan_from_json(doc),
                         doctest::Contains("/capacity/gpu_memory_GiB"),
                         shardplan::core::InputError);
  }
  auto extra = plan;
  extra["capacity"]["gpu_memory_GB"] = 40;
  CHECK_THROWS_WITH_AS(shardplan::documents::plan_from_json(extra),
                       doctest::Contains("gpu_memory_GB"), shardplan::core::InputError);
}
