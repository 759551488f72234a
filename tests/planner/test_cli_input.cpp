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
  const std::string last = args.back();  // CAPTURE reads it when a check fails, after the move
  CAPTURE(last);
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
  check_refused({"estimate", "--strategy", ""},
                "--strategy: must be one of ddp, zero1, zero2, zero3, fsdp-full, fsdp-grad-op, "
                "hsdp, none, got \"\"");
  check_refused({"recommend", "--emit", ""},
                "--emit: must be deepspeed, fsdp, llm-foundry or plan (torchtitan or megatron "
                "with --model-parallel), got \"\"");
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

TEST_CASE("cli_input::an unknown command says the one it most likely meant") {
  check_refused({"recomend", "--gpus", "8"},
                "command line: unknown command \"recomend\" (did you mean recommend?); the "
                "commands are models, hardware, describe, estimate, simulate, recommend, compare, "
                "validate");
  check_refused({"plan"}, "command line: unknown command \"plan\"; the commands are models, "
                          "hardware, describe, estimate, simulate, recommend, compare, validate");
}

TEST_CASE("cli_input::the device memory's other spellings name --gpu-memory-GiB") {
  for (const char* command : {"estimate", "recommend", "compare"})
    for (const char* old_name : {"--device-memory-GiB", "--capacity-GiB"}) {
      CAPTURE(command);
      check_refused({command, old_name, "40"},
                    std::string(old_name) + ": renamed: give --gpu-memory-GiB");
    }
}

TEST_CASE("cli_input::compare takes --strategy as the other commands do, --strategies is refused") {
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
  // nothing unless asked (documents/recipe.hpp, RecipeTraits::checkpointing).
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
  check_refused(
      {"estimate", "--deepspeed", ds, "--model", "gpt2", "--deepspeed-optimizer", "torch"},
      "--deepspeed-optimizer: give either --deepspeed-optimizer or --deepspeed (its "
      "optimizer section says it), not both");
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
                "--flavour: --emit deepspeed writes a config for DeepSpeed's engine (--flavour "
                "deepspeed, stage 0 for ddp), got --flavour fsdp2");
  check_refused({"estimate", "--strategy", "zero1", "--deepspeed-optimizer", "apex"},
                "--deepspeed-optimizer: must be one of fused, torch, got \"apex\"");
  check_refused({"estimate", "--strategy", "ddp", "--deepspeed-optimizer", "torch"},
                "--deepspeed-optimizer: torch: the optimizer under DeepSpeed's engine; the plan "
                "runs ddp");
  check_refused({"recommend", "--model-parallel", "--deepspeed-optimizer", "torch"},
                "--deepspeed-optimizer: torch: the layout search plans each framework's own "
                "optimizer; estimate the layout with it");
  // PyTorch's DDP is not DeepSpeed's stage 0.
  check_refused({"recommend", "--emit", "deepspeed", "--strategy", "ddp", "--flavour", "ddp"},
                "--flavour: --emit deepspeed writes a config for DeepSpeed's engine (--flavour "
                "deepspeed, stage 0 for ddp), got --flavour ddp");
  check_refused({"recommend", "--emit", "fsdp", "--strategy", "zero2"},
                "--strategy: --emit fsdp writes PyTorch settings (ddp, fsdp-full, fsdp-grad-op, "
                "hsdp), got --strategy "
                "zero2");
  check_refused({"recommend", "--emit", "fsdp", "--flavour", "deepspeed"},
                "--flavour: --emit fsdp writes PyTorch settings, got --flavour deepspeed");
  check_refused({"recommend", "--emit", "deepspeed", "--recipe", "torchtitan"},
                "--emit: deepspeed: recipe torchtitan shards with fsdp2 or ddp, not DeepSpeed; use "
                "--emit fsdp");
  check_refused(
      {"recommend", "--emit", "fsdp", "--recipe", "deepspeed"},
      "--emit: fsdp: recipe deepspeed runs under the DeepSpeed engine; use --emit deepspeed");
}

TEST_CASE("cli_input::--strategy none is one GPU without a wrapper, --reduce-dtype is the user's") {
  const std::vector<std::string> job = {"--model",       "llama-2-7b", "--seq-len", "1024",
                                        "--micro-batch", "1",          "--format",  "json"};
  auto estimate = [&](std::vector<std::string> more, int gpus = 1) {
    std::vector<std::string> a = {"estimate", "--gpus", std::to_string(gpus), "--global-batch",
                                  std::to_string(gpus)};
    a.insert(a.end(), job.begin(), job.end());
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  check_refused(estimate({"--strategy", "none"}, 8),
                "--strategy: none runs one GPU without a data-parallel wrapper; got --gpus 8");
  check_refused(estimate({"--strategy", "ddp", "--reduce-dtype", "bf16"}),
                "--reduce-dtype: bf16: DDP reduces the gradients in their own dtype (a "
                "compression hook is not modelled); leave --reduce-dtype out");
  check_refused(estimate({"--strategy", "none", "--reduce-dtype", "fp32"}),
                "--reduce-dtype: fp32: one GPU without a wrapper reduces no gradients; leave "
                "--reduce-dtype out");
  check_refused(
      estimate({"--strategy", "fsdp-full", "--recipe", "torchtitan", "--reduce-dtype", "bf16"}, 8),
      "--reduce-dtype: bf16: torchtitan reduces gradients in fp32 only");
  check_refused(estimate({"--strategy", "fsdp-full", "--reduce-dtype", "fp8"}, 8),
                "--reduce-dtype: must be fp32, bf16 or fp16, got \"fp8\"");
  check_refused({"recommend", "--strategy", "none", "--gpus", "1"},
                "--strategy: none (one GPU, no wrapper) is not searched; estimate it with "
                "planner estimate --strategy none --gpus 1");
  check_refused({"recommend", "--model-parallel", "--reduce-dtype", "fp32"},
                "--reduce-dtype: fp32: the layout search keeps each framework's own reduce "
                "dtype; estimate the layout with it");

  // Without a wrapper the gradients are not copied into DDP's buckets (torch DDP's
  // gradient_as_bucket_view=False keeps a second fp32 copy of every gradient): the buffers at
  // the peak differ by exactly that copy, 4 bytes per parameter of llama-2-7b (6,738,415,616
  // parameters, its exact count).
  const auto none = planner(estimate({"--strategy", "none"}));
  const auto ddp = planner(estimate({"--strategy", "ddp"}));
  REQUIRE(none.code == 0);
  REQUIRE(ddp.code == 0);
  const auto n = nlohmann::json::parse(none.out), d = nlohmann::json::parse(ddp.out);
  CHECK(n.at("strategy") == "none");
  CHECK(n.at("memory").at("breakdown").at("buffers").get<double>() == 0);
  CHECK(d.at("memory").at("breakdown").at("buffers").get<double>() == 4.0 * 6738415616);

  // FSDP's reduce dtype as given: fp32 reductions move twice the bytes of bf16 ones.
  const auto bf16 = planner(estimate({"--strategy", "fsdp-full", "--reduce-dtype", "bf16"}, 8));
  const auto fp32 = planner(estimate({"--strategy", "fsdp-full", "--reduce-dtype", "fp32"}, 8));
  REQUIRE(bf16.code == 0);
  REQUIRE(fp32.code == 0);
  auto rs = [](const Run& r) {
    return nlohmann::json::parse(r.out)
        .at("comm")
        .at("bytes_by_collective")
        .at("reduce_scatter")
        .get<double>();
  };
  CHECK(rs(fp32) == doctest::Approx(2 * rs(bf16)));
}

TEST_CASE("cli_input::a DeepSpeed config's reduce bucket is counted once in its dtype's bytes") {
  // DeepSpeed sizes reduce_bucket_size in elements of the communication dtype (fp32 when the
  // config has no bf16/fp16 section: engine.py communication_data_type; zero/config.py default
  // 5e8): --strategy zero1 --precision fp32 and the same job as a DeepSpeed config hold the same
  // 5e8 x 4 bytes of bucket, never 5e8 x 4 x 2.
  const std::vector<std::string> job = {"--model",   "gpt2", "--gpus",         "2",
                                        "--seq-len", "128",  "--global-batch", "2",
                                        "--format",  "json"};
  std::vector<std::string> flags = {"estimate", "--strategy",    "zero1", "--precision",
                                    "fp32",     "--micro-batch", "1"};
  flags.insert(flags.end(), job.begin(), job.end());
  const auto by_flags = planner(flags);
  REQUIRE(by_flags.code == 0);
  shardplan::planner::Request request;
  request.args = {"estimate"};
  request.args.insert(request.args.end(), job.begin(), job.end());
  request.deepspeed = nlohmann::json{{"train_micro_batch_size_per_gpu", 1},
                                     {"gradient_accumulation_steps", 1},
                                     {"zero_optimization", {{"stage", 1}}}};
  const auto by_config = nlohmann::json::parse(shardplan::planner::run_request(request).output);
  for (const auto& e : {nlohmann::json::parse(by_flags.out), by_config}) {
    CHECK(e.at("precision") == "fp32");
    CHECK(e.at("memory").at("breakdown").at("buffers").get<double>() == 5e8 * 4);
  }
}

TEST_CASE("cli_input::a plan that cannot run as asked is refused with its reason, never zeros") {
  // DDP shards nothing, so it has no optimizer partition to offload: exit 2 naming --offload,
  // nothing on standard output (it printed valid: false with a zero peak and step before).
  check_refused({"estimate", "--model", "gpt2", "--gpus", "8", "--strategy", "ddp", "--offload",
                 "optimizer", "--format", "json"},
                "--offload: ddp cannot offload: offload needs sharded optimizer states (ZeRO or "
                "FSDP)");
  check_refused(
      {"estimate", "--model", "gpt2", "--gpus", "8", "--strategy", "zero1", "--offload", "params"},
      "--offload: zero1 cannot offload parameters: they are not sharded (zero3, "
      "fsdp-full, hsdp can)");
}

// --help says what each option's value is (a count, a size in its unit, a name, a file, a list),
// not TEXT for every one (the options read text and check it themselves).
TEST_CASE("cli_input::help names each value's kind and unit") {
  for (const char* command : {"estimate", "recommend", "compare", "simulate", "validate"}) {
    CAPTURE(command);
    const auto r = planner({command, "--help"});
    CHECK(r.code == 0);
    CHECK(r.out.find(" TEXT") == std::string::npos);
  }
  const auto r = planner({"estimate", "--help"});
  for (const char* shown : {"--gpus INT", "--seq-len TOKENS", "--global-batch SEQUENCES",
                            "--gpu-memory-GiB GiB", "--model NAME|FILE", "--headroom FRACTION"})
    CHECK(r.out.find(shown) != std::string::npos);
}

// FSDP1's backward_prefetch: the hf recipe's is None (transformers' Trainer passes NO_PREFETCH
// to accelerate), torch's default BACKWARD_PRE the others'; --backward-prefetch names it for an
// FSDP1 plan, and the emitted wrapper writes the one the plan was costed with.
TEST_CASE("cli_input::--backward-prefetch is FSDP1's, pre or none") {
  const std::vector<std::string> job = {"--model",   "llama-2-7b", "--gpus",         "8",
                                        "--seq-len", "1024",       "--global-batch", "8"};
  auto with = [&](const char* command, std::vector<std::string> more) {
    std::vector<std::string> a = {command};
    a.insert(a.end(), job.begin(), job.end());
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  check_refused(with("estimate", {"--strategy", "fsdp-full", "--flavour", "fsdp1",
                                  "--backward-prefetch", "post"}),
                "--backward-prefetch: must be one of pre, none, got \"post\" (FSDP1's "
                "BACKWARD_PRE or None; BACKWARD_POST is not modeled)");
  check_refused(with("estimate", {"--strategy", "fsdp-full", "--flavour", "fsdp2",
                                  "--backward-prefetch", "pre"}),
                "--backward-prefetch: pre: FSDP1's backward_prefetch; the plan runs fsdp2, which "
                "has no such setting");
  check_refused(with("recommend", {"--model-parallel", "--backward-prefetch", "none"}),
                "--backward-prefetch: none: the layout search plans FSDP2 and the frameworks' "
                "own engines, not FSDP1");
  const auto fsdp1 = [&](std::vector<std::string> more) {
    auto a = with("estimate", {"--strategy", "fsdp-full", "--flavour", "fsdp1", "--micro-batch",
                               "1", "--format", "json"});
    a.insert(a.end(), more.begin(), more.end());
    const auto r = planner(a);
    REQUIRE(r.code == 0);
    return nlohmann::json::parse(r.out);
  };
  // Gathering a unit ahead in backward keeps one more gathered block beside the one running.
  CHECK(fsdp1({"--backward-prefetch", "pre"}).at("memory").at("peak_bytes").get<double>() >
        fsdp1({}).at("memory").at("peak_bytes").get<double>());
  CHECK(fsdp1({"--backward-prefetch", "none"}).at("memory").at("peak_bytes") ==
        fsdp1({}).at("memory").at("peak_bytes"));
  const auto emitted =
      planner(with("recommend", {"--strategy", "fsdp-full", "--flavour", "fsdp1",
                                 "--backward-prefetch", "none", "--emit", "fsdp"}));
  REQUIRE(emitted.code == 0);
  CHECK(emitted.out.find("    backward_prefetch=None,") != std::string::npos);
  const auto pre = planner(with("recommend", {"--strategy", "fsdp-full", "--flavour", "fsdp1",
                                              "--backward-prefetch", "pre", "--emit", "fsdp"}));
  REQUIRE(pre.code == 0);
  CHECK(pre.out.find("    backward_prefetch=BackwardPrefetch.BACKWARD_PRE,") != std::string::npos);
}
