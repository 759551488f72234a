// A mixture of experts planned through the command line: Mixtral-8x7B (the preset's config.json)
// under transformers' code, data-parallel; what is not modeled is refused with its reason.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_fixture.hpp"

using shardplan::planner::testing::planner;

namespace {

std::vector<std::string> mixtral(std::vector<std::string> more) {
  std::vector<std::string> a = {"estimate",
                                "--model",
                                "mixtral-8x7b",
                                "--hardware",
                                "h100-sxm5-80gb",
                                "--gpus",
                                "16",
                                "--seq-len",
                                "4096",
                                "--global-batch",
                                "64",
                                "--micro-batch",
                                "1",
                                "--checkpointing",
                                "full"};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

}  // namespace

TEST_CASE("moe::Mixtral-8x7B under FSDP2: every parameter sharded, the experts' included") {
  const auto r = planner(mixtral({"--strategy", "fsdp-full", "--format", "json"}));
  INFO(r.err);
  REQUIRE(r.code == 0);
  const auto d = nlohmann::json::parse(r.out);
  // 46,702,792,704 parameters (tests/documents/test_model_moe.cpp, by hand), fp32 shards under
  // the hf recipe's FSDP2 (its mixed precision keeps fp32 shards and gathers bf16): 4 bytes a
  // parameter over 16 ranks, 11,675,698,176, plus FSDP2's padding of each tensor's dim 0 to a
  // multiple of 16 rows (under 0.1% here).
  CHECK(d.at("params") == 46702792704);
  const double shards = d.at("memory").at("breakdown").at("parameters").get<double>();
  CHECK(shards >= 11675698176.0);
  CHECK(shards <= 11675698176.0 * 1.001);
}

TEST_CASE("moe::what is not modeled is refused, naming it") {
  const auto tp = planner(mixtral({"--strategy", "fsdp-full", "--tensor-parallel", "2"}));
  CHECK(tp.code == 2);
  CHECK(tp.err == "planner: --tensor-parallel 2: a mixture of experts under tensor, pipeline or "
                  "context parallelism is not planned yet (nor expert parallelism): plan it "
                  "data-parallel\n");
  const auto titan = planner(mixtral({"--strategy", "fsdp-full", "--recipe", "torchtitan"}));
  CHECK(titan.code == 2);
  CHECK(titan.err == "planner: --model: mixtral-8x7b is a mixture of 8 experts, top-2: the "
                     "torchtitan recipe's own mixture-of-experts code is not modeled; "
                     "transformers' is (--recipe hf, deepspeed or llm-foundry)\n");
}
