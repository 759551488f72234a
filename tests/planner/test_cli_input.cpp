// What the planner makes of the numbers and names on its command line: a value the user gave is
// used or refused (one line, exit code 2), never replaced by a default; integers are decimal.
#include <doctest/doctest.h>

#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_fixture.hpp"

namespace {

using shardplan::planner::testing::planner;
using shardplan::planner::testing::Run;

void check_refused(std::vector<std::string> args, const std::string& err) {
  CAPTURE(args.back());
  const auto r = planner(std::move(args));
  CHECK(r.code == 2);
  CHECK(r.out.empty());
  CHECK(r.err == "planner: " + err + "\n");
}

}  // namespace

TEST_CASE("cli_input::a zero or empty value is refused, not read as the default") {
  const std::vector<std::string> estimate = {"estimate", "--strategy", "ddp"};
  auto with = [&](std::vector<std::string> more) {
    auto a = estimate;
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  check_refused(with({"--gpus", "0"}), "--gpus: must be >= 1, got 0");
  check_refused(with({"--gpus", ""}), "--gpus: must be a whole decimal number, got \"\"");
  check_refused(with({"--seq-len", "0"}), "--seq-len: must be > 0, got 0");
  check_refused(with({"--global-batch", "0"}), "--global-batch: must be > 0, got 0");
  check_refused(with({"--micro-batch", "0"}), "--micro-batch: must be > 0, got 0");
  check_refused(with({"--params", "0"}), "--params: must be between 1e3 and 1e15, got 0");
  check_refused(with({"--params", "1e9", "--layers", "0"}), "--layers: must be > 0, got 0");
  check_refused(with({"--model", ""}), "--model: must name a preset or a file, got \"\"");
  check_refused(with({"--hardware", ""}), "--hardware: must name a profile or a file, got \"\"");
  check_refused(with({"--job", ""}), "--job: must name a file, got \"\"");
  check_refused(with({"--gpus-per-node", "0"}),
                "--gpus-per-node: must be between 1 and 1024, got 0");
  check_refused(with({"--precision", ""}),
                "--precision: must be one of fp32, bf16-mixed, fp16-mixed, bf16, got \"\"");
  check_refused({"estimate", "--strategy", "hsdp", "--shard-group-size", "0"},
                "--shard-group-size: must be >= 1, got 0");
  check_refused({"estimate", "--strategy", ""}, "--strategy: must be one of ddp, zero1, zero2, "
                                                "zero3, fsdp-full, fsdp-grad-op, hsdp, got \"\"");
  check_refused({"recommend", "--emit", ""},
                "--emit: must be deepspeed, fsdp or plan (torchtitan or megatron with "
                "--model-parallel), got \"\"");
  check_refused({"describe", "--model", ""}, "--model: must name a preset or a file, got \"\"");
  check_refused({"describe", "--params", "0"}, "--params: must be between 1e3 and 1e15, got 0");
  check_refused({"compare", "--strategy", ""}, "--strategy: names no strategy, got \"\"");
  // Not given at all: the built-in default job, said in the first line.
  const auto r = planner({"estimate", "--strategy", "ddp"});
  CHECK(r.code == 0);
  CHECK(r.out.rfind(
            "not given, so defaulted: --model llama-2-7b, --hardware a100-sxm4-80gb, --gpus 8, "
            "--seq-len "
            "4096, --global-batch 32 (4 per GPU)\nllama-2-7b (6.74 B params) on 8 x a100-sxm4-80gb",
            0) == 0);
}

TEST_CASE("cli_input::compare takes --strategy as the other commands do; --strategies is refused") {
  check_refused({"compare", "--strategies", "ddp,zero3"},
                "--strategies: renamed: give --strategy (a comma list, as before)");
  const auto r = planner({"compare", "--strategy", "ddp,zero3", "--format", "json"});
  REQUIRE(r.code == 0);
  const auto rows = nlohmann::json::parse(r.out);
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].at("strategy") == "ddp");
  CHECK(rows[1].at("strategy") == "zero3");
}

TEST_CASE("cli_input::compare shows each row's checkpointing, in the table and in JSON") {
  // --checkpointing full is each row's mode as given; the default job (recipe hf) checkpoints
  // nothing unless asked (documents/job.hpp, default_checkpointing).
  const auto json = planner(
      {"compare", "--strategy", "ddp,zero3", "--checkpointing", "full", "--format", "json"});
  REQUIRE(json.code == 0);
  for (const auto& row : nlohmann::json::parse(json.out)) CHECK(row.at("checkpointing") == "full");
  const auto table = planner({"compare", "--strategy", "ddp,zero3", "--checkpointing", "every:4"});
  REQUIRE(table.code == 0);
  std::istringstream lines(table.out);
  int rows = 0;
  bool header = false;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("strategy ", 0) == 0) header = line.find(" checkpointing ") != std::string::npos;
    if (line.rfind("ddp ", 0) == 0 || line.rfind("zero3 ", 0) == 0) {
      CHECK(line.find(" every:4 ") != std::string::npos);
      ++rows;
    }
  }
  CHECK(header);
  CHECK(rows == 2);
}

TEST_CASE("cli_input::integer flags are decimal: 010 is ten, 0x10 is refused") {
  // --gpus 010 is ten GPUs (not octal 8): not a multiple of 8 per node.
  check_refused({"estimate", "--strategy", "ddp", "--gpus", "010"},
                "--gpus: 10 is not a multiple of --gpus-per-node 8; 8 or 16 would be");
  const auto leading_zero =
      planner({"estimate", "--strategy", "ddp", "--gpus", "016", "--format", "json"});
  REQUIRE(leading_zero.code == 0);
  CHECK(leading_zero.out.find("\"gpus\": 16,") != std::string::npos);
  check_refused({"estimate", "--strategy", "ddp", "--gpus", "0x10"},
                "--gpus: must be a whole decimal number, got \"0x10\"");
  check_refused({"estimate", "--strategy", "ddp", "--seq-len", "0x1000"},
                "--seq-len: must be a whole decimal number, got \"0x1000\"");
  check_refused({"estimate", "--strategy", "ddp", "--gpus", "+8"},
                "--gpus: must be a whole decimal number, got \"+8\"");
  check_refused({"estimate", "--strategy", "ddp", "--gpus", "5000000000"},
                "--gpus: must be between -2147483648 and 2147483647, got \"5000000000\"");
  check_refused({"recommend", "--top", "0x3"},
                "--top: must be a whole decimal number, got \"0x3\"");
  check_refused({"estimate", "--strategy", "ddp", "--params", "0x1p40"},
                "--params: must be a decimal number, got \"0x1p40\"");
  check_refused({"estimate", "--strategy", "ddp", "--headroom", "nan"},
                "--headroom: must be a decimal number, got \"nan\"");
  check_refused({"estimate", "--strategy", "ddp", "--params", "inf"},
                "--params: must be a decimal number, got \"inf\"");
  const auto params =
      planner({"estimate", "--strategy", "zero3", "--params", "7.5e9", "--format", "json"});
  CHECK(params.code == 0);
  CHECK(params.out.find("\"params\": 7500000000,") != std::string::npos);
}

TEST_CASE("cli_input::bytes past what a plan can count are bad input, never a wrapped number") {
  // 1e6 sequences of 2^20 tokens per micro-batch: 3.6e21 bytes per GPU, past 2^62; the JSON showed
  // peak_bytes −9223372036854775808.
  const std::vector<std::string> job = {"--params",  "1e14",    "--gpus",         "1000000",
                                        "--seq-len", "1048576", "--global-batch", "1000000000000",
                                        "--format",  "json"};
  std::vector<std::string> args = {"estimate", "--strategy", "zero3", "--micro-batch", "1000000"};
  args.insert(args.end(), job.begin(), job.end());
  const auto r = planner(args);
  CHECK(r.code == 2);
  CHECK(r.out.empty());
  CHECK(r.err.rfind("planner: --micro-batch: 1000000 sequences of 1048576 tokens: "
                    "params:100000000000000 needs "
                    "3.59e+21 bytes per GPU under zero3",
                    0) == 0);
  args[0] = "compare";
  args.erase(args.begin() + 1, args.begin() + 3);
  const auto c = planner(args);
  CHECK(c.code == 2);
  CHECK(c.err.rfind("planner: --micro-batch: 1000000 sequences of 1048576 tokens:", 0) == 0);
  // Without --micro-batch, even one sequence of 1e8 tokens of a 1e15-parameter model is too much
  // under eager attention (its scores are seq² per head).
  const auto seq = planner({"estimate", "--strategy", "ddp", "--params", "1e15", "--seq-len",
                            "100000000", "--attention", "eager", "--format", "json"});
  CHECK(seq.code == 2);
  CHECK(seq.err.rfind("planner: --seq-len: 100000000 tokens, even 1 sequence per micro-batch:",
                      0) == 0);
}

TEST_CASE("cli_input::--gpu-memory-GiB replaces the profile's memory and says so") {
  const std::vector<std::string> estimate = {
      "estimate",   "--strategy",     "zero3",  "--model", "gpt2",
      "--hardware", "a100-sxm4-80gb", "--gpus", "8",       "--seq-len",
      "1024",       "--global-batch", "8"};
  auto with = [&](std::vector<std::string> more) {
    auto a = estimate;
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  check_refused(with({"--gpu-memory-GiB", "0"}),
                "--gpu-memory-GiB: must be > 0 and <= 1000000, got 0");
  check_refused(with({"--gpu-memory-GiB", "-2"}),
                "--gpu-memory-GiB: must be > 0 and <= 1000000, got -2");
  check_refused(with({"--gpu-memory-GiB", "2e6"}),
                "--gpu-memory-GiB: must be > 0 and <= 1000000, got 2e6");
  check_refused(with({"--gpu-memory-GiB", "inf"}),
                "--gpu-memory-GiB: must be a decimal number, got \"inf\"");
  check_refused(with({"--gpu-memory-GiB", "nan"}),
                "--gpu-memory-GiB: must be a decimal number, got \"nan\"");
  check_refused(with({"--gpu-memory-GiB", ""}),
                "--gpu-memory-GiB: must be a decimal number, got \"\"");

  const auto table = planner(with({"--gpu-memory-GiB", "40"}));
  REQUIRE(table.code == 0);
  CHECK(table.out.find(
            "hardware a100-sxm4-80gb: 40 GiB per GPU (--gpu-memory-GiB; the profile's 80 GiB)") !=
        std::string::npos);
  const auto json = planner(with({"--gpu-memory-GiB", "40", "--format", "json"}));
  REQUIRE(json.code == 0);
  const auto doc = nlohmann::json::parse(json.out);
  CHECK(doc["memory"]["capacity_bytes"] == 42949672960.0);  // 40 x 2^30
  CHECK(doc["hardware_profile"]["gpu_memory_from"] == "--gpu-memory-GiB");
  CHECK(doc["hardware_profile"]["profile_gpu_memory_GiB"] == 80.0);
}

TEST_CASE("cli_input::the header says how the inter-node bandwidth is read") {
  // a100-pcie-40gb: 100 GB/s per node (4 x 200 Gb/s) over 8 GPUs = 12.5 GB/s per GPU.
  const auto pcie =
      planner({"estimate", "--strategy", "hsdp", "--model", "gpt2", "--hardware", "a100-pcie-40gb",
               "--gpus", "16", "--seq-len", "1024", "--global-batch", "16"});
  REQUIRE(pcie.code == 0);
  CHECK(pcie.out.find("inter-node 12.5 GB/s per GPU = 100 GB/s per node of 8 GPUs (profile's "
                      "bandwidth_GBps_per_node)") != std::string::npos);
  // h100-sxm5-80gb: one 400 Gb/s NDR port per GPU = 50 GB/s per GPU, 400 GB/s per node of 8.
  const auto dgx =
      planner({"estimate", "--strategy", "hsdp", "--model", "gpt2", "--hardware", "h100-sxm5-80gb",
               "--gpus", "16", "--seq-len", "1024", "--global-batch", "16", "--format", "json"});
  REQUIRE(dgx.code == 0);
  const auto doc = nlohmann::json::parse(dgx.out)["hardware_profile"];
  CHECK(doc["inter_node_GBps_per_gpu"] == 50.0);
  CHECK(doc["inter_node_GBps_per_node"] == 400.0);
  CHECK(doc["inter_node_key"] == "bandwidth_GBps_per_gpu");
}

TEST_CASE("cli_input::what is defaulted is said first, and a DeepSpeed config needs its model") {
  const std::string ds = std::string(SHARDPLAN_SOURCE_DIR) + "/examples/deepspeed/zero1-fp16.json";
  check_refused(
      {"estimate", "--deepspeed", ds, "--gpus", "16"},
      "--model: missing: a DeepSpeed config does not name the model; give --model (a preset or a "
      "config.json) or --params");
  // Beside a config, a flag its zero_optimization already states would be dropped: refused.
  check_refused(
      {"estimate", "--deepspeed", ds, "--model", "gpt2", "--offload", "optimizer"},
      "--offload: give either --offload or --deepspeed (its zero_optimization says it), not both");
  check_refused(
      {"estimate", "--deepspeed", ds, "--model", "gpt2", "--flavour", "fsdp2"},
      "--flavour: give either --flavour or --deepspeed (its zero_optimization says it), not both");
  check_refused({"estimate", "--deepspeed", ds, "--model", "gpt2", "--shard-group-size", "4"},
                "--shard-group-size: give either --shard-group-size or --deepspeed (its "
                "zero_optimization says "
                "it), not both");
  const auto r = planner(
      {"estimate", "--deepspeed", ds, "--model", "gpt2", "--gpus", "16", "--global-batch", "32"});
  REQUIRE(r.code == 0);
  CHECK(r.out.rfind("not given, so defaulted: --hardware a100-sxm4-80gb, --seq-len 4096\n", 0) ==
        0);
  // Everything given: no such line.
  const auto all =
      planner({"estimate", "--strategy", "ddp", "--model", "gpt2", "--hardware", "a100-sxm4-80gb",
               "--gpus", "8", "--seq-len", "1024", "--global-batch", "8"});
  REQUIRE(all.code == 0);
  CHECK(all.out.rfind("gpt2 (124.44 M params) on 8 x a100-sxm4-80gb", 0) == 0);
}

TEST_CASE("cli_input::recommend refuses flags it would drop") {
  check_refused({"recommend", "--strategy", "zero3", "--shard-group-size", "4"},
                "--shard-group-size: applies to hsdp only, not zero3");
  check_refused(
      {"recommend", "--emit", "deepspeed", "--format", "json"},
      "--format: shapes the table, and --emit deepspeed prints a config instead; give one of them");
  check_refused(
      {"recommend", "--emit", "plan", "--top", "3"},
      "--top: shapes the table, and --emit plan prints a config instead; give one of them");
  check_refused({"recommend", "--emit", "deepspeed", "--flavour", "fsdp2"},
                "--flavour: --emit deepspeed writes a DeepSpeed config, got --flavour fsdp2");
  check_refused({"recommend", "--emit", "fsdp", "--strategy", "zero2"},
                "--strategy: --emit fsdp writes PyTorch settings (ddp, fsdp-full, fsdp-grad-op, "
                "hsdp), got --strategy "
                "zero2");
  check_refused({"recommend", "--emit", "fsdp", "--flavour", "deepspeed"},
                "--flavour: --emit fsdp writes PyTorch settings, got --flavour deepspeed");
  check_refused({"recommend", "--emit", "deepspeed", "--recipe", "torchtitan"},
                "--emit: deepspeed: recipe torchtitan shards with FSDP2 or DDP, not DeepSpeed; use "
                "--emit fsdp");
  check_refused(
      {"recommend", "--emit", "fsdp", "--recipe", "deepspeed"},
      "--emit: fsdp: recipe deepspeed runs under the DeepSpeed engine; use --emit deepspeed");
}
