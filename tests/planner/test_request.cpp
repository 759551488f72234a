// run_request (planner/cli.hpp): the command line's subcommands called in a process, as the Python
// module calls them: the same output as the program, documents in memory in place of files.
#include <doctest/doctest.h>

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_fixture.hpp"
#include "core/input_error.hpp"
#include "planner/cli.hpp"

namespace {

using shardplan::core::InputError;
using shardplan::planner::Request;
using shardplan::planner::run_request;
using shardplan::planner::testing::planner;

nlohmann::json file_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

}  // namespace

TEST_CASE("request::the program's output for the same arguments") {
  const std::vector<std::string> args = {"estimate", "--model=llama-2-7b", "--gpus=16",
                                         "--strategy=zero3", "--format=json"};
  const auto run = planner(args);
  REQUIRE(run.code == 0);
  CHECK(run_request({args, {}, {}, false, {}}).output == run.out);
  const std::vector<std::string> emit = {"recommend", "--model=gpt2", "--gpus=8", "--emit=fsdp"};
  const auto text = planner(emit);
  REQUIRE(text.code == 0);
  const auto response = run_request({emit, {}, {}, false, {}});
  CHECK(response.output == text.out);
  CHECK(!response.notes.empty());  // "--emit fsdp: searching PyTorch's plans only", as on stderr
}

TEST_CASE("request::documents in memory plan as their files") {
  const std::string dir = SHARDPLAN_SOURCE_DIR;
  Request by_file{{"estimate", "--model=" + dir + "/examples/models/mistral-7b/config.json",
                   "--hardware=" + dir + "/hardware_profiles/l40s-48gb.json", "--gpus=8",
                   "--strategy=fsdp-full", "--format=json"},
                  {},
                  {},
                  false,
                  {}};
  Request by_document{{"estimate", "--gpus=8", "--strategy=fsdp-full", "--format=json"},
                      file_json(dir + "/examples/models/mistral-7b/config.json"),
                      file_json(dir + "/hardware_profiles/l40s-48gb.json"),
                      false,
                      {}};
  auto a = nlohmann::json::parse(run_request(by_file).output);
  auto b = nlohmann::json::parse(run_request(by_document).output);
  // Only the names differ: a file is named by its path, a document by its own name or "model".
  for (auto* j : {&a, &b})
    (*j)["model"] = (*j)["hardware"] = (*j)["hardware_profile"]["name"] = nullptr;
  CHECK(a == b);  // "defaulted" included: a document given is not --model or --hardware defaulted
  CHECK(b["defaulted"].dump().find("--model") == std::string::npos);
}

TEST_CASE("request::bad input throws, naming the flag or the document") {
  CHECK_THROWS_WITH_AS(
      run_request({{"estimate", "--gpus=0", "--strategy=zero3"}, {}, {}, false, {}}),
      "--gpus: must be >= 1, got 0", InputError);
  CHECK_THROWS_WITH_AS(run_request({{"estimate", "--no-such-flag=1"}, {}, {}, false, {}}),
                       doctest::Contains("arguments: "), InputError);
  CHECK_THROWS_WITH_AS(run_request({{"estimate", "--strategy=zero3"},
                                    nlohmann::json{{"architectures", {"Nope"}}},
                                    {},
                                    false,
                                    {}}),
                       doctest::Contains("model: /architectures"), InputError);
  CHECK_THROWS_WITH_AS(run_request({{"estimate", "--model=gpt2", "--strategy=zero3"},
                                    nlohmann::json::object(),
                                    {},
                                    false,
                                    {}}),
                       "--model: give either a name or a document, not both", InputError);
}

TEST_CASE("request::fsdp settings as data carry the program's text") {
  const std::vector<std::string> emit = {"recommend",       "--model=gpt2",
                                         "--gpus=8",        "--strategy=fsdp-full",
                                         "--flavour=fsdp2", "--emit=fsdp"};
  const auto data = nlohmann::json::parse(run_request({emit, {}, {}, true, {}}).output);
  CHECK(data["text"] == planner(emit).out);
  CHECK(data["fully_shard"]["reshard_after_forward"] == true);  // FULL_SHARD
  CHECK(data["torchtitan"]["parallelism"]["data_parallel_shard_degree"] == 8);
}

TEST_CASE(
    "request::an MPT model plans under llm-foundry's recipe, and what is not modeled is said") {
  // llm-foundry's MPT (documents/model_mpt.cpp; its block: costmodel/block_table.cpp, mpt_rows).
  nlohmann::json mpt = {{"architectures", {"MPTForCausalLM"}},
                        {"model_type", "mpt"},
                        {"d_model", 64},
                        {"n_heads", 4},
                        {"n_layers", 2},
                        {"max_seq_len", 32},
                        {"vocab_size", 128},
                        {"_name_or_path", "tiny-mpt"}};
  const std::vector<std::string> job = {"estimate",     "--strategy=fsdp-full",
                                        "--gpus=2",     "--global-batch=4",
                                        "--seq-len=32", "--format=json"};
  auto with = [&](const char* recipe) {
    auto args = job;
    args.emplace_back(recipe);
    return args;
  };
  const auto planned =
      nlohmann::json::parse(run_request({with("--recipe=llm-foundry"), mpt, {}, false, {}}).output);
  CHECK(planned.at("valid") == true);
  CHECK(planned.at("params") == 110336);  // llm-foundry's own count (mpt_params.json, mpt-default)
  CHECK_THROWS_WITH_AS(run_request({with("--recipe=hf"), mpt, {}, false, {}}),
                       "--model: MPT's model code is llm-foundry's: plan it with --recipe "
                       "llm-foundry, not hf",
                       InputError);
  // Its attn_impl is the kernel the job runs: "torch" plans eager attention unless the job names
  // flash, which is refused.
  mpt["attn_config"] = {{"attn_impl", "torch"}};
  const auto eager =
      nlohmann::json::parse(run_request({with("--recipe=llm-foundry"), mpt, {}, false, {}}).output);
  CHECK(eager.at("memory").at("peak_bytes").get<double>() >
        planned.at("memory").at("peak_bytes").get<double>());  // the scores and the mask
  auto flash = with("--recipe=llm-foundry");
  flash.emplace_back("--attention=flash");
  CHECK_THROWS_WITH_AS(run_request({flash, mpt, {}, false, {}}),
                       "--attention: flash: the MPT config's attn_config.attn_impl \"torch\" runs "
                       "eager attention",
                       InputError);
  // Dropout plans (its masks measured: tests/costmodel/data/oracle_mpt_units.json); a sliding
  // window does not.
  mpt["attn_config"] = {{"attn_impl", "torch"}, {"attn_pdrop", 0.1}};
  mpt["resid_pdrop"] = 0.1;
  const auto dropped =
      nlohmann::json::parse(run_request({with("--recipe=llm-foundry"), mpt, {}, false, {}}).output);
  CHECK(dropped.at("memory").at("peak_bytes").get<double>() >
        eager.at("memory").at("peak_bytes").get<double>());  // the noise and the masks
  mpt["attn_config"] = {{"sliding_window_size", 128}};
  CHECK_THROWS_WITH_AS(run_request({with("--recipe=llm-foundry"), mpt, {}, false, {}}),
                       "--model: MPT's attn_config.sliding_window_size is not modeled yet",
                       InputError);
}
