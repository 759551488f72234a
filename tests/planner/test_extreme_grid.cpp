// A property test over extreme inputs: estimate and compare, through the command line with JSON
// output, for every combination of a grid from a tiny model on one GPU to 1e14 parameters on a
// million GPUs with a million sequences of a million tokens per micro-batch. Each run either is
// refused as bad input (exit code 2, one line naming a flag) or prints numbers that are finite,
// non-negative (the margin to the usable memory aside: negative when the plan does not fit) and
// consistent: the breakdown at the peak sums to the peak, and the peak holds the model states.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cli_fixture.hpp"

namespace {

using nlohmann::json;

using shardplan::planner::testing::planner;
using shardplan::planner::testing::Run;

// Every number under j finite and >= 0 (margin_bytes may be negative); where: its JSON pointer.
void check_numbers(const json& j, const std::string& where) {
  if (j.is_structured()) {
    for (const auto& [key, value] : j.items())
      if (key != "margin_bytes") check_numbers(value, std::string(where).append("/").append(key));
    return;
  }
  if (!j.is_number()) return;
  INFO(where << " = " << j.dump());
  if (j.is_number_float()) CHECK(std::isfinite(j.get<double>()));
  CHECK(j.get<double>() >= 0);
}

void check_evaluation(const json& e) {
  check_numbers(e, "");
  const auto& m = e.at("memory");
  CHECK(m.at("margin_bytes").is_number());
  const double peak = m.at("peak_bytes").get<double>();
  double at_peak = 0;
  for (const auto& [name, bytes] : m.at("breakdown").items()) at_peak += bytes.get<double>();
  INFO(e.dump());
  // Rounded category by category: within a byte a category.
  CHECK(at_peak == doctest::Approx(peak).epsilon(1e-9));
  CHECK(std::fabs(at_peak - peak) <= std::max(8.0, 1e-12 * peak));
  if (e.at("valid").get<bool>()) CHECK(peak >= m.at("model_states_bytes").get<double>());
}

// Bad input: one line, naming a flag, exit code 2, nothing on standard output.
bool refused(const Run& r) {
  if (r.code != 2) return false;
  CHECK(r.out.empty());
  CHECK(r.err.rfind("planner: --", 0) == 0);
  CHECK(r.err.find('\n') == r.err.size() - 1);
  return true;
}

}  // namespace

TEST_CASE(
    "extreme_grid::estimate and compare print finite, non-negative, consistent numbers or refuse") {
  const std::vector<std::string> params = {"1", "1e6", "7e9", "1e12", "1e14"};
  const std::vector<long long> gpus = {1, 8, 1000, 1000000};
  const std::vector<std::string> seq = {"1", "4096", "1048576"};
  const std::vector<long long> micro = {1, 64, 1000000};
  const std::vector<std::string> strategies = {"ddp",   "zero1",     "zero2",
                                               "zero3", "fsdp-full", "hsdp"};
  int runs = 0, answered = 0;
  for (const auto& p : params)
    for (long long g : gpus)
      for (const auto& s : seq)
        for (long long mb : micro)
          for (const std::string& global : {std::to_string(g * mb), std::string("1000000000000")}) {
            const std::vector<std::string> job = {
                "--params",       p,      "--gpus",        std::to_string(g),
                "--seq-len",      s,      "--micro-batch", std::to_string(mb),
                "--global-batch", global, "--format",      "json"};
            std::string line;
            for (const auto& a : job) line += a + " ";
            CAPTURE(line);
            auto compare = job;
            compare.insert(compare.begin(), "compare");
            const auto c = planner(compare);
            ++runs;
            if (!refused(c)) {
              REQUIRE(c.code == 0);
              ++answered;
              const auto all = json::parse(c.out);
              REQUIRE(all.size() == 7);
              for (const auto& e : all) check_evaluation(e);
            }
            for (const auto& strategy : strategies) {
              auto estimate = job;
              estimate.insert(estimate.begin(), {"estimate", "--strategy", strategy});
              const auto r = planner(estimate);
              ++runs;
              if (refused(r)) continue;
              REQUIRE(r.code == 0);
              ++answered;
              check_evaluation(json::parse(r.out));
            }
          }
  MESSAGE(runs << " runs, " << answered << " answered with numbers");
  CHECK(answered > runs / 4);  // the grid is not all refusals
}

TEST_CASE("extreme_grid::every layout is a report with numbers or one refusal, never zeros") {
  // Tensor, pipeline and context parallelism over degrees that fit and that do not (heads,
  // layers, nodes, GPUs, sequences, batches), with each schedule: exit 0 with a valid document
  // whose peak and step are positive and whose stages hold the model's blocks, or exit 2 with
  // one line naming a flag.
  int runs = 0, answered = 0;
  for (const char* t : {"1", "3", "8", "16"})
    for (const char* p : {"1", "3", "4", "7"})
      for (const char* c : {"1", "2", "3"})
        for (const char* schedule : {"1f1b", "interleaved-1f1b", "gpipe"})
          for (const char* seq : {"4095", "8192"}) {
            std::vector<std::string> a = {"estimate",
                                          "--model",
                                          "llama-3-70b",
                                          "--gpus",
                                          "192",
                                          "--seq-len",
                                          seq,
                                          "--global-batch",
                                          "96",
                                          "--strategy",
                                          "zero1",
                                          "--tensor-parallel",
                                          t,
                                          "--pipeline-parallel",
                                          p,
                                          "--context-parallel",
                                          c,
                                          "--schedule",
                                          schedule,
                                          "--format",
                                          "json"};
            if (std::string(schedule) == "interleaved-1f1b")
              a.insert(a.end(), {"--virtual-stages", "2"});
            const std::string line = fmt::format("{}", fmt::join(a, " "));
            CAPTURE(line);
            const auto r = planner(a);
            ++runs;
            if (refused(r)) continue;
            REQUIRE(r.code == 0);
            ++answered;
            const auto e = json::parse(r.out);
            check_evaluation(e);
            CHECK(e.at("valid") == true);
            CHECK(e.at("memory").at("peak_bytes").get<double>() > 0);
            CHECK(e.at("time").at("step_s").get<double>() > 0);
            double blocks = 0;
            for (const auto& st : e.at("stages")) blocks += st.at("blocks").get<double>();
            CHECK(blocks == 80);
          }
  MESSAGE(runs << " layouts, " << answered << " answered with numbers");
  CHECK(answered > 0);
  CHECK(answered < runs);  // and some refused
}
