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
#include <optional>
#include <random>
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

// Random valid jobs, through the command line as users run it: besides the numbers above, the
// step is the sum of the parts the report names, a larger micro-batch never lowers the peak or
// the activations at it, more GPUs under ZeRO-3 never raise the model states per GPU, and the
// recommendation fits and is never slower than a candidate that fits.
namespace {

struct RandomJob {
  std::string model, hardware, strategy, checkpointing;
  long long gpus = 0, seq = 0, micro = 0;
  long long global() const { return gpus * micro * 4; }  // 2 x micro divides it too
  std::vector<std::string> args(long long n, long long mb, const std::string& s) const {
    return {"--model",         model,
            "--hardware",      hardware,
            "--gpus",          std::to_string(n),
            "--seq-len",       std::to_string(seq),
            "--micro-batch",   std::to_string(mb),
            "--global-batch",  std::to_string(n * micro * 4),
            "--checkpointing", checkpointing,
            "--strategy",      s};
  }
};

std::optional<json> estimate_json(std::vector<std::string> args) {
  args.insert(args.begin(), "estimate");
  args.insert(args.end(), {"--format", "json"});
  const auto r = planner(args);
  if (r.code != 0) return std::nullopt;
  return json::parse(r.out);
}

double at(const json& e, const char* part, const char* key) {
  return e.at(part).at(key).get<double>();
}

void check_job_properties(const RandomJob& j) {
  const auto base = estimate_json(j.args(j.gpus, j.micro, j.strategy));
  REQUIRE(base.has_value());  // every job of this grid is valid
  check_evaluation(*base);
  CHECK(at(*base, "time", "step_s") ==
        doctest::Approx(at(*base, "time", "compute_s") + at(*base, "time", "bubble_s") +
                        at(*base, "time", "exposed_comm_s"))
            .epsilon(1e-9));
  double waits = 0;  // the compute stream's waits, by the stream it waited on
  for (const auto& [stream, seconds] : base->at("time").at("exposed_by_stream_s").items())
    waits += seconds.get<double>();
  CHECK(waits == doctest::Approx(at(*base, "time", "exposed_comm_s")).epsilon(1e-9));
  const auto twice = estimate_json(j.args(j.gpus, 2 * j.micro, j.strategy));
  REQUIRE(twice.has_value());
  CHECK(at(*twice, "memory", "peak_bytes") >= at(*base, "memory", "peak_bytes"));
  CHECK(twice->at("memory").at("breakdown").at("activations").get<double>() >=
        base->at("memory").at("breakdown").at("activations").get<double>());
  const auto zero3 = estimate_json(j.args(j.gpus, j.micro, "zero3"));
  const auto zero3_more = estimate_json(j.args(2 * j.gpus, j.micro, "zero3"));
  REQUIRE((zero3.has_value() && zero3_more.has_value()));
  CHECK(at(*zero3_more, "memory", "model_states_bytes") <=
        at(*zero3, "memory", "model_states_bytes"));
}

// The same job with the strategy, micro-batch and checkpointing left to the search. Returns
// whether it recommended a plan (nothing may fit: that is said, not recommended).
bool check_recommendation(const RandomJob& j) {
  const auto r = planner({"recommend", "--model", j.model, "--hardware", j.hardware, "--gpus",
                          std::to_string(j.gpus), "--seq-len", std::to_string(j.seq),
                          "--global-batch", std::to_string(j.global()), "--format", "json"});
  REQUIRE(r.code == 0);
  const auto doc = json::parse(r.out);
  if (doc.at("recommendation").is_null()) return false;
  const auto& best = doc.at("recommendation");
  CHECK(best.at("fits").get<bool>());
  for (const auto& c : doc.at("candidates"))
    if (c.at("fits").get<bool>())
      CHECK(at(best, "time", "step_s") <= at(c, "time", "step_s") * (1 + 1e-12));
  return true;
}

}  // namespace

TEST_CASE("extreme_grid::random valid jobs keep the properties a plan must have") {
  std::mt19937 rng(20261204);  // fixed: the same jobs on every run
  const auto pick = [&](const auto& v) {
    return v[std::uniform_int_distribution<std::size_t>(0, v.size() - 1)(rng)];
  };
  const std::vector<std::string> models = {"gpt2", "llama-2-7b", "mistral-7b", "llama-3-8b"};
  const std::vector<std::string> hardware = {"a100-sxm4-80gb", "h100-sxm5-80gb", "l40s-48gb",
                                             "a100-sxm4-40gb"};
  const std::vector<std::string> strategies = {"ddp", "zero1", "zero2", "zero3", "fsdp-full"};
  const std::vector<std::string> modes = {"none", "full"};
  const std::vector<long long> gpus = {8, 16, 64}, seqs = {512, 2048, 4096}, micros = {1, 2, 4};
  int jobs = 0, recommended = 0;
  for (int i = 0; i < 40; ++i) {
    RandomJob j;
    j.model = pick(models);
    j.hardware = pick(hardware);
    j.strategy = pick(strategies);
    j.checkpointing = pick(modes);
    j.gpus = pick(gpus);
    j.seq = pick(seqs);
    j.micro = pick(micros);
    CAPTURE(fmt::format("{}", fmt::join(j.args(j.gpus, j.micro, j.strategy), " ")));
    check_job_properties(j);
    ++jobs;
    if (i % 5 == 0 && check_recommendation(j)) ++recommended;  // a search: every fifth job
  }
  MESSAGE(jobs << " random jobs, " << recommended << " searches with a recommendation");
  CHECK(recommended > 0);
}

// Properties over a grid of layouts and recipes (tensor, pipeline and context parallelism with
// each recipe's blocks), through the command line: the step is the sum of the parts the report
// names (compute, bubble, exposed waits) and the exposed waits the sum of their dimensions';
// memory never falls when the tokens per rank grow (the sequence doubled, the layout the same);
// t = 1, p = 1 and c = 1 given explicitly are the same estimate as not given.
TEST_CASE("extreme_grid::layouts keep the properties a plan must have, for every recipe") {
  int layouts = 0;
  for (const char* recipe : {"hf", "torchtitan", "megatron"})
    for (const char* strategy : {"zero1", "fsdp-full"})
      for (const char* t : {"1", "2", "4"})
        for (const char* p : {"1", "2", "4"})
          for (const char* c : {"1", "2"}) {
            auto args = [&](const char* seq) {
              return std::vector<std::string>{"--model",
                                              "llama-3-8b",
                                              "--hardware",
                                              "h100-sxm5-80gb",
                                              "--gpus",
                                              "64",
                                              "--seq-len",
                                              seq,
                                              "--global-batch",
                                              "32",
                                              "--micro-batch",
                                              "1",
                                              "--strategy",
                                              strategy,
                                              "--recipe",
                                              recipe,
                                              "--tensor-parallel",
                                              t,
                                              "--pipeline-parallel",
                                              p,
                                              "--context-parallel",
                                              c,
                                              "--checkpointing",
                                              "full"};
            };
            CAPTURE(fmt::format("{}", fmt::join(args("4096"), " ")));
            const auto shorter = estimate_json(args("4096"));
            const auto longer = estimate_json(args("8192"));
            if (!shorter || !longer) continue;  // refused (a test above checks refusals' form)
            ++layouts;
            for (const auto* e : {&*shorter, &*longer}) {
              check_evaluation(*e);
              const auto& time = e->at("time");
              CHECK(time.at("step_s").get<double>() ==
                    doctest::Approx(time.at("compute_s").get<double>() +
                                    time.at("bubble_s").get<double>() +
                                    time.at("exposed_comm_s").get<double>())
                        .epsilon(1e-9));
              double waits = 0;
              for (const auto& [dimension, s] : time.at("exposed_by_dimension_s").items())
                waits += s.get<double>();
              CHECK(waits ==
                    doctest::Approx(time.at("exposed_comm_s").get<double>()).epsilon(1e-9));
            }
            CHECK(at(*longer, "memory", "peak_bytes") >= at(*shorter, "memory", "peak_bytes"));
          }
  MESSAGE(layouts << " layouts answered");
  CHECK(layouts > 20);
}

TEST_CASE("extreme_grid::a degree of 1 given explicitly is the estimate without it") {
  for (const char* recipe : {"hf", "torchtitan", "megatron", "executor"})
    for (const char* strategy : {"ddp", "zero2", "fsdp-full"}) {
      const std::vector<std::string> job = {"--model",    "llama-2-7b", "--gpus",         "16",
                                            "--seq-len",  "2048",       "--global-batch", "32",
                                            "--strategy", strategy,     "--recipe",       recipe};
      CAPTURE(fmt::format("{}", fmt::join(job, " ")));
      const auto plain = estimate_json(job);
      REQUIRE(plain.has_value());
      for (const char* flag : {"--tensor-parallel", "--pipeline-parallel", "--context-parallel"}) {
        auto given = job;
        given.insert(given.end(), {flag, "1"});
        const auto explicit_one = estimate_json(given);
        REQUIRE(explicit_one.has_value());
        CHECK(*explicit_one == *plain);
      }
    }
}
