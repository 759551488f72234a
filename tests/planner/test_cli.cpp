// The planner command line: golden outputs of fixed cases, and one-line rejections with exit 2.
// Regenerate the golden files after an intended change with SHARDPLAN_UPDATE_GOLDEN=1.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_fixture.hpp"

namespace {

using shardplan::planner::testing::planner;
using shardplan::planner::testing::Run;

// Run time is the one thing that changes between runs.
std::string without_timing(std::string s) {
  s = std::regex_replace(s, std::regex(R"(simulated\) in [0-9.]+ s)"), "simulated) in <t> s");
  return std::regex_replace(s, std::regex(R"("seconds": [0-9.e+-]+)"), "\"seconds\": 0");
}

void check_golden(const std::string& name, const std::string& got) {
  const std::string path = std::string(SHARDPLAN_SOURCE_DIR) + "/tests/planner/golden/" + name;
  if (std::getenv("SHARDPLAN_UPDATE_GOLDEN")) {
    std::ofstream(path) << got;
    return;
  }
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "missing golden file " << name);
  std::stringstream want;
  want << in.rdbuf();
  CHECK(got == want.str());
}

}  // namespace

TEST_CASE("cli::golden recommend table of the default job") {
  const auto r = planner({"recommend"});
  REQUIRE(r.code == 0);
  CHECK(r.out.rfind("no model or hardware given: planning the built-in default job", 0) == 0);
  check_golden("recommend_default.txt", without_timing(r.out));
}

TEST_CASE("cli::golden recommend json") {
  const auto r =
      planner({"recommend", "--model", "llama-2-7b", "--hardware", "a100-sxm4-40gb", "--gpus", "8",
               "--seq-len", "2048", "--global-batch", "32", "--format", "json", "--top", "3"});
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["recommendation"]["fits"] == true);
  for (const char* k : {"strategy", "flavour", "micro_batch", "checkpointing", "offload"})
    CHECK(j["recommendation"].contains(k));
  CHECK(j["recommendation"]["memory"]["peak_bytes"].is_number_integer());
  CHECK(j["recommendation"]["time"]["step_s"].is_number());
  CHECK(j["search"]["plans_evaluated"].get<long>() > 0);
  CHECK(j["rejected"][0]["family"] == "ddp");
  check_golden("recommend_llama7b_a100_40gb.json", without_timing(r.out));
}

TEST_CASE("cli::golden estimate table and json") {
  const std::vector<std::string> args = {
      "estimate",   "--model", "gpt2",      "--hardware", "h100-sxm5-80gb", "--gpus", "16",
      "--strategy", "zero3",   "--seq-len", "1024",       "--global-batch", "64"};
  const auto table = planner(args);
  REQUIRE(table.code == 0);
  check_golden("estimate_gpt2_zero3.txt", table.out);
  auto json_args = args;
  json_args.insert(json_args.end(), {"--format", "json"});
  const auto json = planner(json_args);
  REQUIRE(json.code == 0);
  const auto j = nlohmann::json::parse(json.out);
  CHECK(j["params"] == 124439808);
  for (const char* k :
       {"parameters", "gradients", "optimizer_states", "activations", "buffers", "overhead"})
    CHECK(j["memory"]["breakdown"].contains(k));
  CHECK(j["fits"] == true);
  check_golden("estimate_gpt2_zero3.json", json.out);
}

TEST_CASE("cli::emitted configs parse and keep the chosen settings") {
  const auto ds = planner({"recommend", "--flavour", "deepspeed", "--emit", "deepspeed"});
  REQUIRE(ds.code == 0);
  const auto j = nlohmann::json::parse(ds.out);
  CHECK(j["zero_optimization"]["stage"].get<int>() >= 1);
  CHECK(j["train_batch_size"] == 32);
  const auto plan = planner({"recommend", "--emit", "plan"});
  REQUIRE(plan.code == 0);
  CHECK(nlohmann::json::parse(plan.out)["kind"] == "shardplan.plan");
  const auto fsdp = planner(
      {"recommend", "--strategy", "hsdp", "--flavour", "fsdp2", "--gpus", "16", "--emit", "fsdp"});
  REQUIRE(fsdp.code == 0);
  CHECK(fsdp.out.find("fully_shard(") != std::string::npos);
  CHECK(fsdp.out.find("data_parallel_replicate_degree = 2") != std::string::npos);
  // An existing DeepSpeed config is estimated with its assumptions stated.
  const auto est =
      planner({"estimate", "--model", "llama-2-7b", "--deepspeed",
               std::string(SHARDPLAN_SOURCE_DIR) + "/examples/deepspeed/zero2-offload-bf16.json",
               "--format", "json"});
  REQUIRE(est.code == 0);
  const auto e = nlohmann::json::parse(est.out);
  CHECK(e["strategy"] == "zero2");
  CHECK(e["offload"] == "optimizer");
  CHECK(e["assumptions"].size() > 0);
}

TEST_CASE("cli::describe prints the exact parameter count") {
  const auto r = planner({"describe", "--model", "llama-2-7b", "--format", "json"});
  REQUIRE(r.code == 0);
  CHECK(nlohmann::json::parse(r.out)["params"] == 6738415616LL);
}

TEST_CASE("cli::zero paper figure 1 from the command line") {
  // Rajbhandari et al. 2020, Figure 1: 7.5B parameters on 64 GPUs.
  const char* strategies[] = {"ddp", "zero1", "zero2", "zero3"};
  const double want_GB[] = {120.0, 31.4, 16.6, 1.9};
  for (int i = 0; i < 4; ++i) {
    const auto r =
        planner({"estimate", "--params", "7.5e9", "--gpus", "64", "--global-batch", "64",
                 "--strategy", strategies[i], "--accounting", "zero-paper", "--format", "json"});
    REQUIRE(r.code == 0);
    const double got =
        nlohmann::json::parse(r.out)["memory"]["model_states_bytes"].get<double>() / 1e9;
    CHECK(got == doctest::Approx(want_GB[i]).epsilon(0.02));
  }
}

TEST_CASE("cli::bad input is one line and exit code 2") {
  struct Case {
    std::vector<std::string> args;
    std::string err;
  };
  const Case cases[] = {
      {{"estimate", "--strategy", "zero4"},
       "planner: --strategy: must be one of ddp, zero1, zero2, zero3, fsdp-full, fsdp-grad-op, "
       "hsdp, none, got \"zero4\"\n"},
      {{"estimate", "--strategy", "ddp", "--gpus", "12"},
       "planner: --gpus: 12 is not a multiple of --gpus-per-node 8; 8 or 16 would be\n"},
      {{"estimate", "--strategy", "ddp", "--global-batch", "20"},
       "planner: --global-batch: 20 sequences do not divide over 8 GPUs; use a multiple of 8\n"},
      {{"estimate", "--strategy", "ddp", "--precision", "fp8"},
       "planner: --precision: must be one of fp32, bf16-mixed, fp16-mixed, bf16, got \"fp8\"\n"},
      {{"estimate", "--strategy", "ddp", "--model", "no-such-model"},
       "planner: --model: \"no-such-model\" is neither a preset (gpt2, gpt2-medium, gpt2-large, "
       "gpt2-xl, "
       "llama-2-7b, llama-2-13b, llama-2-70b, llama-3-8b, llama-3-70b, llama-3.1-405b, mistral-7b, "
       "mixtral-8x7b) nor a file\n"},
      {{"estimate", "--strategy", "ddp", "--seq-len", "-5"},
       "planner: --seq-len: must be > 0, got -5\n"},
      {{"recommend", "--headroom", "1.5"}, "planner: --headroom: must be in [0, 1), got 1.5\n"},
      {{"recommend", "--format", "xml"}, "planner: --format: must be table or json, got \"xml\"\n"},
      {{"recommend", "--emit", "megatron"},
       "planner: --emit: megatron prints a layout of --model-parallel; give it, or --emit fsdp for "
       "a data-parallel plan\n"},
      {{"recommend", "--emit", "yaml"},
       "planner: --emit: must be deepspeed, fsdp, llm-foundry or plan (torchtitan or megatron "
       "with --model-parallel), got \"yaml\"\n"},
      {{"recommend", "--emit", "deepspeed", "--strategy", "fsdp-full"},
       "planner: --strategy: --emit deepspeed writes a DeepSpeed config (ddp or zero1-3), got "
       "--strategy "
       "fsdp-full\n"},
      {{"estimate"}, "planner: --strategy: missing (or give --deepspeed ds_config.json)\n"},
      {{"estimate", "--strategy", "zero3", "--flavour", "fsdp2"},
       "planner: --flavour: zero3 is not implemented by fsdp2; use deepspeed\n"},
      {{"describe", "--params", "-1"}, "planner: --params: must be between 1e3 and 1e15, got -1\n"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.args[0]);
    CAPTURE(c.args.back());
    const auto r = planner(c.args);
    CHECK(r.code == 2);
    CHECK(r.out.empty());
    CHECK(r.err == c.err);
  }
  // An unknown flag is CLI11's message, still one line and exit 2.
  const auto r = planner({"estimate", "--strategy", "ddp", "--gpuz", "8"});
  CHECK(r.code == 2);
  CHECK(r.out.empty());
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
}

TEST_CASE("cli::recommend keeps the job document's micro-batch, checkpointing and loss") {
  // What the user wrote in --job is used as given, as a flag would be: the search does not range
  // over it, and the plan records it.
  const auto dir = std::filesystem::temp_directory_path() / "shardplan-cli-job";
  std::filesystem::create_directories(dir);
  const auto job = (dir / "job.json").string();
  std::ofstream(job)
      << R"({"schema_version": 1, "seq_len": 4096, "global_batch": 32, "micro_batch": 1,
                            "checkpointing": "every:2", "recipe": "torchtitan", "loss": "chunked:4"})";
  const auto r = planner({"recommend", "--job", job, "--gpus", "8", "--format", "json"});
  REQUIRE(r.code == 0);
  const auto doc = nlohmann::json::parse(r.out);
  for (const auto& c : doc.at("candidates")) {
    CHECK(c.at("micro_batch") == 1);
    CHECK(c.at("checkpointing") == "every:2");
    CHECK(c.at("loss") == "chunked:4");
    CHECK(c.at("recipe") == "torchtitan");
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("cli::a --job document's value is named by its file and key, a flag's by the flag") {
  const auto dir = std::filesystem::temp_directory_path() / "shardplan-cli-job-field";
  std::filesystem::create_directories(dir);
  const auto job = (dir / "job.json").string();
  std::ofstream(job) << R"({"schema_version": 1, "seq_len": 1024, "global_batch": 8,
                            "micro_batch": 3, "checkpointing": "every:33"})";
  const auto file = planner({"estimate", "--strategy", "zero3", "--gpus", "8", "--job", job});
  CHECK(file.code == 2);
  CHECK(file.err == "planner: " + job +
                        ": /checkpointing: every:33 counts past the model's 32 layers (every:32 "
                        "at most)\n");
  const auto batch = planner(
      {"estimate", "--strategy", "zero3", "--gpus", "8", "--job", job, "--checkpointing", "full"});
  CHECK(batch.err == "planner: " + job +
                         ": /micro_batch: 3 does not divide the 1 sequences per GPU (global batch "
                         "8 / 8 GPUs)\n");
  const auto flag = planner({"estimate", "--strategy", "zero3", "--gpus", "8", "--job", job,
                             "--checkpointing", "full", "--micro-batch", "3"});
  CHECK(flag.err ==
        "planner: --micro-batch: 3 does not divide the 1 sequences per GPU (global batch 8 / 8 "
        "GPUs)\n");
  std::filesystem::remove_all(dir);
}

TEST_CASE("cli::every:N past the layers is refused, whichever way the recipe counts") {
  // torchtitan 0.2 checkpoints its N-th, 2N-th ... block: none of llama-2-7b's 32 at N = 33;
  // transformers starts at layer 0, so every:33 there would checkpoint layer 0 alone. Up to
  // N = 32 each checkpoints at least one block.
  for (const char* recipe : {"torchtitan", "hf"}) {
    CAPTURE(recipe);
    const auto r = planner(
        {"estimate", "--strategy", "zero3", "--recipe", recipe, "--checkpointing", "every:33"});
    CHECK(r.code == 2);
    CHECK(r.err == "planner: --checkpointing: every:33 counts past the model's 32 layers "
                   "(every:32 at most)\n");
    CHECK(planner({"estimate", "--strategy", "zero3", "--recipe", recipe, "--checkpointing",
                   "every:32"})
              .code == 0);
  }
}

TEST_CASE("cli::a chunked loss of more chunks than a sequence's tokens is refused") {
  const auto r = planner(
      {"estimate", "--strategy", "zero3", "--seq-len", "4096", "--loss", "chunked:99999999999"});
  CHECK(r.code == 2);
  CHECK(r.err == "planner: --loss: chunked:99999999999 splits each sequence into 99999999999 "
                 "pieces, more than its 4096 tokens\n");
  CHECK(planner({"estimate", "--strategy", "zero3", "--seq-len", "4096", "--loss", "chunked:4096"})
            .code == 0);
}

TEST_CASE(
    "cli::another loss is searched only when allowed, and a plan that needs it says so first") {
  // llama-3-8b at 8,192 tokens on 8 x A100-40GB: with transformers' own loss the best plan is
  // ZeRO-3 at micro-batch 1; allowed Liger's fused linear cross-entropy, micro-batch 4, whose
  // peak holds only with that loss in the training code.
  const std::vector<std::string> job = {
      "recommend", "--model", "llama-3-8b",     "--hardware", "a100-sxm4-40gb", "--gpus", "8",
      "--seq-len", "8192",    "--global-batch", "32"};
  auto with = [&](std::vector<std::string> more) {
    auto a = job;
    a.insert(a.end(), more.begin(), more.end());
    return planner(a);
  };
  const auto own = with({"--format", "json"});
  REQUIRE(own.code == 0);
  const auto own_doc = nlohmann::json::parse(own.out);
  CHECK(own_doc["recommendation"]["loss"] == "upcast");
  CHECK_FALSE(own_doc.contains("requires"));
  for (const auto& c : own_doc["candidates"]) CHECK(c["loss"] == "upcast");

  const std::string note = "this plan needs the loss fused-linear: Liger's fused linear "
                           "cross-entropy (pip install liger-kernel; call "
                           "liger_kernel.transformers.apply_liger_kernel_to_llama(), or the "
                           "function for the model's architecture, before the model is built), "
                           "not recipe hf's own (upcast); its peak assumes it";
  const auto liger = with({"--losses", "fused-linear", "--format", "json"});
  REQUIRE(liger.code == 0);
  const auto liger_doc = nlohmann::json::parse(liger.out);
  CHECK(liger_doc["recommendation"]["loss"] == "fused-linear");
  CHECK(liger_doc["requires"] == nlohmann::json::array({note}));
  const auto table = with({"--losses", "fused-linear"});
  CHECK(table.out.rfind("NOTE: " + note + "\n", 0) == 0);
  const auto ds = with({"--losses", "fused-linear", "--emit", "deepspeed"});
  REQUIRE(ds.code == 0);
  CHECK(nlohmann::json::parse(ds.out)["comment"].get<std::string>().rfind("NOTE: " + note, 0) == 0);
  CHECK(ds.err.rfind("planner: NOTE: " + note + "\n", 0) == 0);
  const auto fsdp = with({"--losses", "fused-linear", "--emit", "fsdp"});
  REQUIRE(fsdp.code == 0);
  CHECK(fsdp.out.rfind("# NOTE: " + note + "\n", 0) == 0);

  const auto both = with({"--losses", "fused-linear", "--loss", "upcast"});
  CHECK(both.code == 2);
  CHECK(both.err == "planner: --losses: --loss pins the loss; give one of --loss and --losses\n");
  const auto bad = with({"--losses", "liger"});
  CHECK(bad.code == 2);
  CHECK(bad.err.rfind("planner: --losses: must be one of ", 0) == 0);
  const auto layouts = with({"--losses", "fused-linear", "--model-parallel"});
  CHECK(layouts.code == 2);
  CHECK(layouts.err ==
        "planner: --losses: the model-parallel search keeps the recipe's loss (or --loss)\n");
}

// `planner hardware` says where its profiles come from: the folder SHARDPLAN_DATA_DIR names, or,
// without it, the source tree a build tree was configured from (the test binary's folder holds no
// share/shardplan), not as if that were an installed copy.
TEST_CASE("cli::the hardware list names where its profiles come from") {
  const char* before = std::getenv("SHARDPLAN_DATA_DIR");
  const std::string saved = before ? before : "";
  ::setenv("SHARDPLAN_DATA_DIR", SHARDPLAN_SOURCE_DIR, 1);
  const auto named = planner({"hardware"});
  CHECK(named.code == 0);
  CHECK(named.out.find(std::string("(profiles in ") + SHARDPLAN_SOURCE_DIR +
                       "/hardware_profiles: the folder SHARDPLAN_DATA_DIR names;") !=
        std::string::npos);
  ::unsetenv("SHARDPLAN_DATA_DIR");
  const auto built = planner({"hardware"});
  CHECK(built.code == 0);
  CHECK(built.out.find("the source tree this build was configured from") != std::string::npos);
  if (before) ::setenv("SHARDPLAN_DATA_DIR", saved.c_str(), 1);
}
