// `planner estimate` with tensor, pipeline and context parallelism: the flags, their refusals and
// the per-stage report.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_fixture.hpp"

namespace {

using shardplan::planner::testing::planner;

std::vector<std::string> llama70b(std::vector<std::string> more) {
  std::vector<std::string> a = {"estimate",       "--model",        "llama-3-70b", "--hardware",
                                "h100-sxm5-80gb", "--gpus",         "256",         "--seq-len",
                                "8192",           "--global-batch", "64",          "--strategy",
                                "fsdp-full",      "--recipe",       "megatron"};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

void refused(const std::vector<std::string>& more, const std::string& err) {
  const auto r = planner(llama70b(more));
  CHECK(r.code == 2);
  CHECK(r.out.empty());
  CHECK(r.err == "planner: " + err + "\n");
}

}  // namespace

TEST_CASE("cli_parallel::estimate reports per stage and names the peak stage") {
  const auto r = planner(
      llama70b({"--tensor-parallel", "8", "--sequence-parallel", "--pipeline-parallel", "4"}));
  CHECK(r.code == 0);
  CHECK(r.err.empty());
  // 256 / (8·4) = 8 replicas; 64 sequences / 8 = 8 micro-batches of 1 through the pipeline.
  CHECK(
      has(r.out,
          "parallelism: tensor 8 with sequence parallel, pipeline 4 (1f1b, 8 micro-batches of 1), "
          "context 1, data 8 (fsdp-full)"));
  CHECK(has(r.out,
            "peak happens at                            stage 0 of 4 (embeddings, 20 blocks, "
            "4 micro-batches in flight)"));
  // More than one stage: the stage table, each stage's peak and compute per micro-batch.
  CHECK(has(r.out, "stage blocks in flight"));
  const auto j = planner(
      llama70b({"--tensor-parallel", "8", "--sequence-parallel", "--pipeline-parallel", "4",
                "--schedule", "interleaved-1f1b", "--virtual-stages", "5", "--format", "json"}));
  REQUIRE(j.code == 0);
  const auto doc = nlohmann::json::parse(j.out);
  CHECK(doc["stages"].size() == 4);
  CHECK(doc["parallelism"]["virtual_stages"] == 5);
  // Interleaving 5 chunks: the walk's bubble below 1F1B's (p − 1)/m = 3/8.
  CHECK(doc["time"]["bubble_fraction"].get<double>() < 3.0 / 8);
  // p·(1 + (p − 1)/(p·v)) = 4·(1 + 3/20) = 4.6 micro-batches in flight on the first stage.
  CHECK(doc["stages"][0]["in_flight_micro_batches"].get<double>() == doctest::Approx(4.6));
}

TEST_CASE("cli_parallel::refusals name the flags and the numbers") {
  refused({"--tensor-parallel", "0"},
          "--tensor-parallel: must be between 1 and 2147483647, got \"0\"");
  // Beyond an int: the same range, not the int's own.
  refused({"--tensor-parallel", "9223372036854775807"},
          "--tensor-parallel: must be between 1 and 2147483647, got \"9223372036854775807\"");
  refused({"--tensor-parallel", "9223372036854775808"},
          "--tensor-parallel: must be between 1 and 2147483647, got \"9223372036854775808\"");
  refused({"--tensor-parallel", "two"},
          "--tensor-parallel: must be a whole decimal number, got \"two\"");
  refused({"--pipeline-parallel", "8", "--async-tensor-parallel"},
          "--pipeline-parallel 8 --async-tensor-parallel: async tensor parallelism needs tensor "
          "parallel > 1");
  refused({"--tensor-parallel", "8", "--async-tensor-parallel"},
          "--tensor-parallel 8 --async-tensor-parallel: async tensor parallelism overlaps sequence "
          "parallelism's all-gathers and reduce-scatters: it needs --sequence-parallel");
  refused({"--schedule", "zero-bubble"},
          "--schedule: must be one of 1f1b, interleaved-1f1b, gpipe, got \"zero-bubble\"");
  refused(
      {"--tensor-parallel", "16"},
      "--tensor-parallel 16: tensor parallel 16 is larger than a node of 8 GPUs: its all-reduces "
      "per layer "
      "would cross the inter-node links; 8 key/value heads do not divide over tensor parallel 16");
  refused({"--tensor-parallel", "8", "--pipeline-parallel", "3"},
          "--gpus: 256 GPUs are not a multiple of tensor 8 x pipeline 3 x context 1 = 24");
  refused({"--tensor-parallel", "8", "--micro-batches", "3"},
          "--micro-batches: 3 does not divide the 2 sequences per replica");
  refused({"--pipeline-parallel", "4", "--virtual-stages", "2"},
          "--pipeline-parallel 4 --virtual-stages 2: virtual stages 2 need the interleaved-1f1b "
          "schedule, not 1f1b");
}

TEST_CASE("cli_parallel::recommend --model-parallel ranks layouts and gives their options") {
  const auto r = planner({"recommend", "--model", "llama-3-70b", "--hardware", "h100-sxm5-80gb",
                          "--gpus", "256", "--seq-len", "8192", "--global-batch", "256", "--recipe",
                          "megatron", "--model-parallel", "--top", "3"});
  CHECK(r.code == 0);
  CHECK(has(r.out, "data parallelism alone: best"));
  // The recipe's own framework's arguments only: torchtitan's options would run another code.
  CHECK_FALSE(has(r.out, "torchtitan: "));
  CHECK(has(r.out, "Megatron-LM: --tensor-model-parallel-size "));
  const auto e = planner({"recommend", "--gpus", "16", "--model-parallel", "--emit", "megatron"});
  CHECK(e.code == 0);
  CHECK(has(e.out, "--tensor-model-parallel-size "));
  const auto bad = planner({"recommend", "--gpus", "16", "--model-parallel", "--emit", "yaml"});
  CHECK(bad.code == 2);
  CHECK(bad.err == "planner: --emit: with --model-parallel must be torchtitan, megatron, deepspeed "
                   "or plan, got \"yaml\"\n");
}

TEST_CASE("cli_parallel::a degree of 1 given explicitly is the same estimate as none given") {
  // The one-dimensional walk either way: t = 1, p = 1 or c = 1 names the layout the flags leave
  // out, so the document is the same, byte for byte.
  const std::vector<std::string> job = {
      "estimate",       "--model", "llama-2-7b", "--gpus",    "8",        "--seq-len", "4096",
      "--global-batch", "16",      "--strategy", "fsdp-full", "--format", "json"};
  const auto plain = planner(job);
  REQUIRE(plain.code == 0);
  for (const char* flag : {"--tensor-parallel", "--pipeline-parallel", "--context-parallel"}) {
    CAPTURE(flag);
    auto with = job;
    with.insert(with.end(), {flag, "1"});
    const auto r = planner(with);
    CHECK(r.code == 0);
    CHECK(r.out == plain.out);
  }
  auto all = job;
  all.insert(all.end(),
             {"--tensor-parallel", "1", "--pipeline-parallel", "1", "--context-parallel", "1"});
  CHECK(planner(all).out == plain.out);
}

TEST_CASE("cli_parallel::recommend widens to model parallelism when data parallelism cannot run "
          "the job, and says so first") {
  // 512 sequences over 2048 GPUs: no data-parallel plan exists, so the layouts are searched
  // (it answered "512 sequences do not divide over 2048 GPUs" unless --model-parallel was given).
  const std::vector<std::string> job = {"recommend",  "--model",        "llama-3-70b",
                                        "--hardware", "h100-sxm5-80gb", "--gpus",
                                        "2048",       "--global-batch", "512"};
  // Under the default recipe (hf): transformers' Trainer runs tensor and context parallelism,
  // no pipeline (documents/recipe.cpp); under torchtitan all three.
  const auto text = planner(job);
  REQUIRE(text.code == 0);
  CHECK(text.out.rfind("data parallelism alone cannot run this job (512 sequences do not divide "
                       "over 2048 GPUs): searching tensor and context parallelism too",
                       0) == 0);
  auto titan = job;
  titan.insert(titan.end(), {"--recipe", "torchtitan"});
  CHECK(planner(titan).out.rfind("data parallelism alone cannot run this job (512 sequences do "
                                 "not divide over 2048 GPUs): searching tensor, pipeline and "
                                 "context parallelism too",
                                 0) == 0);
  // llm-foundry's trainer runs none: nothing to widen to, the batch is refused as before.
  auto foundry = job;
  foundry.insert(foundry.end(), {"--recipe", "llm-foundry"});
  const auto f = planner(foundry);
  CHECK(f.code == 2);
  CHECK(has(f.err, "--global-batch"));
  foundry.emplace_back("--model-parallel");
  CHECK(planner(foundry).err == "planner: --model-parallel: the llm-foundry recipe's trainer runs "
                                "no tensor, pipeline or context parallelism\n");
  auto json_job = job;
  json_job.insert(json_job.end(), {"--format", "json"});
  const auto j = planner(json_job);
  REQUIRE(j.code == 0);
  const auto d = nlohmann::json::parse(j.out);
  CHECK(d.contains("model_parallel_because"));
  // A data-parallel knob pinned keeps the search one-dimensional: the batch is refused as before.
  auto pinned = job;
  pinned.insert(pinned.end(), {"--strategy", "zero3"});
  const auto r = planner(pinned);
  CHECK(r.code == 2);
  CHECK(has(r.err, "--global-batch"));
}

TEST_CASE("cli_parallel::recommend widens to model parallelism when no data-parallel plan fits") {
  // llama-3-70b at 131,072 tokens per sequence on 32 H100s: every data-parallel plan's peak is
  // above the usable 75.67 GiB (activations of a whole sequence per GPU), so the layouts are
  // searched and the answer says why first.
  const std::vector<std::string> job = {
      "recommend", "--model", "llama-3-70b",    "--hardware", "h100-sxm5-80gb", "--gpus", "32",
      "--seq-len", "131072",  "--global-batch", "32"};
  const auto text = planner(job);
  REQUIRE(text.code == 0);
  CHECK(text.out.rfind("no data-parallel plan fits (the smallest peak is ", 0) == 0);
  CHECK(has(text.out, "searching tensor and context parallelism too"));
  auto json_job = job;
  json_job.insert(json_job.end(), {"--format", "json"});
  const auto d = nlohmann::json::parse(planner(json_job).out);
  REQUIRE(d.contains("model_parallel_because"));
  REQUIRE(!d.at("ranked").empty());
  // Each candidate is estimate's document of its layout, fitting.
  const auto& best = d.at("ranked").at(0);
  CHECK(best.at("fits") == true);
  CHECK(best.at("memory").at("peak_bytes").get<double>() <=
        best.at("memory").at("usable_bytes").get<double>());
  const auto& l = best.at("parallelism");
  CHECK(l.at("tensor_parallel").get<int>() * l.at("pipeline_parallel").get<int>() *
            l.at("context_parallel").get<int>() >
        1);
  // Where no layout fits either (70B's states on 8 A100s of 40 GB), the data-parallel answer
  // (why nothing fits, what would) stands and says the layouts were searched too.
  const auto none = planner({"recommend", "--model", "llama-3-70b", "--hardware", "a100-sxm4-40gb",
                             "--gpus", "8", "--seq-len", "8192", "--global-batch", "8"});
  REQUIRE(none.code == 0);
  CHECK(has(none.out, "NO PLAN FITS"));
  CHECK(has(none.out, "tensor and context parallelism searched too ("));
  CHECK(has(none.out, "): none fits either\n"));
  // --data-parallel-only keeps the search one-dimensional: the data-parallel answer, nothing
  // searched beside it; with --model-parallel it is refused.
  auto only = job;
  only.emplace_back("--data-parallel-only");
  const auto dp = planner(only);
  REQUIRE(dp.code == 0);
  CHECK(has(dp.out, "NO PLAN FITS"));
  CHECK_FALSE(has(dp.out, "searched too"));
  only.emplace_back("--model-parallel");
  const auto both = planner(only);
  CHECK(both.code == 2);
  CHECK(both.err ==
        "planner: --data-parallel-only: give either it or --model-parallel, not both\n");
}

TEST_CASE("cli_parallel::uneven pipeline splits: torchtitan's default, Megatron's flags") {
  // Llama-3.1-405B's 126 blocks over 8 stages (refused before: "126 layers do not divide over
  // pipeline 8"). torchtitan counts the embeddings and the head as a block each: 15, 16 x 6, 15.
  const std::vector<std::string> job = {"estimate",
                                        "--model",
                                        "llama-3.1-405b",
                                        "--hardware",
                                        "h100-sxm5-80gb",
                                        "--gpus",
                                        "512",
                                        "--seq-len",
                                        "8192",
                                        "--global-batch",
                                        "64",
                                        "--strategy",
                                        "fsdp-full",
                                        "--checkpointing",
                                        "full",
                                        "--micro-batch",
                                        "1",
                                        "--tensor-parallel",
                                        "8",
                                        "--sequence-parallel",
                                        "--pipeline-parallel",
                                        "8",
                                        "--format",
                                        "json"};
  auto titan = job;
  titan.insert(titan.end(), {"--recipe", "torchtitan"});
  const auto t = planner(titan);
  REQUIRE(t.code == 0);
  const auto d = nlohmann::json::parse(t.out);
  std::vector<double> blocks;
  for (const auto& st : d.at("stages")) blocks.push_back(st.at("blocks").get<double>());
  CHECK(blocks == std::vector<double>{15, 16, 16, 16, 16, 16, 16, 15});
  CHECK(d.at("parallelism").at("first_stage_less_layers") == 1);
  CHECK(d.at("parallelism").at("last_stage_less_layers") == 1);
  // The text says the recipe's split, which no flag asked for.
  auto text = titan;
  text.erase(std::find(text.begin(), text.end(), "--format"),
             std::find(text.begin(), text.end(), "--format") + 2);
  CHECK(has(planner(text).out, "pipeline 8 (1f1b, 8 micro-batches of 1, the embeddings and the "
                               "head counted as 1 and 1 blocks)"));
  // Megatron-LM splits evenly: refused as it refuses, accepted with the embeddings and the loss
  // counted (--account-for-embedding/loss-in-pipeline-split: 128 over 8).
  auto megatron = job;
  megatron.insert(megatron.end(), {"--recipe", "megatron"});
  const auto refused_split = planner(megatron);
  CHECK(refused_split.code == 2);
  CHECK(has(refused_split.err,
            "Megatron-LM splits 126 layers evenly over pipeline 8 x virtual stages 1 = 8: they "
            "do not divide"));
  megatron.insert(megatron.end(),
                  {"--first-stage-less-layers", "1", "--last-stage-less-layers", "1"});
  const auto m = planner(megatron);
  REQUIRE(m.code == 0);
  CHECK(nlohmann::json::parse(m.out).at("stages").at(0).at("blocks") == 15);
  // The flags' own refusals.
  refused({"--pipeline-parallel", "4", "--first-stage-less-layers", "-1"},
          "--first-stage-less-layers: must be between 0 and 2147483647, got \"-1\"");
  refused({"--tensor-parallel", "8", "--last-stage-less-layers", "1"},
          "--tensor-parallel 8 --last-stage-less-layers 1: first and last stage less layers (0 "
          "and 1) need pipeline parallel > 1");
}

// torchtitan's default checkpointing under its default tensor parallelism (refused before): the
// save list on each rank's local tensors (tests/costmodel/data/oracle_tp_units.json), between no
// recompute and full recompute in memory and time; the rerun's collectives are in the step.
TEST_CASE("cli_parallel::torchtitan's op-level selective checkpointing under tensor parallelism") {
  auto at = [](const char* checkpointing, bool sequence_parallel) {
    std::vector<std::string> a = {"estimate",
                                  "--model",
                                  "llama-3-70b",
                                  "--hardware",
                                  "h100-sxm5-80gb",
                                  "--gpus",
                                  "64",
                                  "--seq-len",
                                  "8192",
                                  "--global-batch",
                                  "16",
                                  "--micro-batch",
                                  "1",
                                  "--strategy",
                                  "fsdp-full",
                                  "--recipe",
                                  "torchtitan",
                                  "--tensor-parallel",
                                  "8",
                                  "--checkpointing",
                                  checkpointing,
                                  "--format",
                                  "json"};
    if (sequence_parallel) a.emplace_back("--sequence-parallel");
    const auto r = planner(a);
    REQUIRE_MESSAGE(r.code == 0, r.err);
    return nlohmann::json::parse(r.out);
  };
  auto peak = [](const nlohmann::json& d) { return d.at("memory").at("peak_bytes").get<double>(); };
  auto step = [](const nlohmann::json& d) { return d.at("time").at("step_s").get<double>(); };
  for (const bool sp : {true, false}) {
    CAPTURE(sp);
    const auto none = at("none", sp), op = at("selective-op", sp), full = at("full", sp);
    CHECK(peak(full) < peak(op));
    CHECK(peak(op) < peak(none));
    CHECK(step(none) < step(op));
    CHECK(step(op) < step(full));
  }
}

TEST_CASE("cli_parallel::torchtitan's op-level selective checkpointing under a pipeline") {
  // torchtitan's default checkpointing, refused with any model parallelism before. A pipeline
  // stage of its blocks keeps each block's save list (the data-parallel walk's block) and reruns
  // wo and w3 before the backward: between no recompute and full recompute, in memory and time.
  auto at = [](const char* checkpointing) {
    const auto r = planner({"estimate",
                            "--model",
                            "llama-3-70b",
                            "--hardware",
                            "h100-sxm5-80gb",
                            "--gpus",
                            "256",
                            "--seq-len",
                            "8192",
                            "--global-batch",
                            "64",
                            "--micro-batch",
                            "1",
                            "--strategy",
                            "fsdp-full",
                            "--recipe",
                            "torchtitan",
                            "--pipeline-parallel",
                            "8",
                            "--checkpointing",
                            checkpointing,
                            "--format",
                            "json"});
    REQUIRE(r.code == 0);
    return nlohmann::json::parse(r.out);
  };
  const auto none = at("none"), op = at("selective-op"), full = at("full");
  auto peak = [](const nlohmann::json& d) { return d.at("memory").at("peak_bytes").get<double>(); };
  auto step = [](const nlohmann::json& d) { return d.at("time").at("step_s").get<double>(); };
  CHECK(peak(full) < peak(op));
  CHECK(peak(op) < peak(none));
  CHECK(step(none) < step(op));
  CHECK(step(op) < step(full));
  // Megatron-LM has no such mode, in any layout (its GPT is not PyTorch modules the policy
  // wraps).
  for (const char* flag : {"--pipeline-parallel", "--tensor-parallel", "--context-parallel"}) {
    const auto mega = planner(llama70b({flag, "4", "--checkpointing", "selective-op"}));
    CHECK(mega.code == 2);
    CHECK(has(mega.err, "--checkpointing: selective-op: recipe megatron does not run "
                        "torchtitan's per-op save list; it checkpoints none | full | "
                        "selective-attention"));
  }
  // Nor does the executor, without model parallelism either.
  const auto executor =
      planner({"estimate", "--model", "gpt2", "--gpus", "2", "--seq-len", "128", "--global-batch",
               "2", "--recipe", "executor", "--checkpointing", "selective-op"});
  CHECK(executor.code == 2);
  CHECK(has(executor.err, "--checkpointing: selective-op: recipe executor does not run "
                          "torchtitan's per-op save list; it checkpoints none | full\n"));
  // The save list counts a block's aten::mm calls, derived for torchtitan's block and
  // transformers' Llama family: GPT-2's Conv1D under transformers' code is refused, naming it.
  const auto gpt2 =
      planner({"estimate", "--model", "gpt2", "--gpus", "2", "--seq-len", "128", "--global-batch",
               "2", "--recipe", "hf", "--checkpointing", "selective-op"});
  CHECK(gpt2.code == 2);
  CHECK(has(gpt2.err, "--checkpointing: selective-op: torchtitan's per-op save list is derived "
                      "for its own block and transformers' Llama, Mistral and Qwen2, not for gpt2 "
                      "(GPT2LMHeadModel) under recipe hf; it checkpoints none | full | every:N | "
                      "selective-attention\n"));
  CHECK(gpt2.out.empty());
}

namespace {

// Bytes from one of the table's cells ("1.06 GiB", "12.50 MiB", "3.00 KiB", "12 B").
double cell_bytes(const std::string& number, const std::string& unit) {
  const double v = std::stod(number);
  if (unit == "GiB") return v * 1024 * 1024 * 1024;
  if (unit == "MiB") return v * 1024 * 1024;
  if (unit == "KiB") return v * 1024;
  return v;
}

}  // namespace

// The stage table's memory columns add up to each stage's peak (the overhead has its column: the
// CUDA context, NCCL's workspace and the allocator's reserve), within the cells' rounding.
TEST_CASE("cli_parallel::each stage's row adds up to its peak") {
  const auto r = planner(llama70b({"--tensor-parallel", "8", "--sequence-parallel",
                                   "--pipeline-parallel", "4", "--micro-batch", "1"}));
  REQUIRE(r.code == 0);
  std::istringstream lines(r.out);
  std::string line;
  int rows = 0;
  bool in_table = false;
  while (std::getline(lines, line)) {
    if (line.find("overhead") != std::string::npos && line.find("stage") != std::string::npos) {
      in_table = true;
      continue;
    }
    if (!in_table) continue;
    if (line.empty()) break;  // the table ends
    std::istringstream row(line);
    std::string stage, blocks, in_flight;
    row >> stage >> blocks >> in_flight;
    std::vector<double> cells;  // parameters, gradients, optimizer, buffers, activations, overhead,
    std::string number, unit;   // peak
    for (int k = 0; k < 7 && row >> number >> unit; ++k) cells.push_back(cell_bytes(number, unit));
    REQUIRE(cells.size() == 7);
    double sum = 0;
    for (int k = 0; k < 6; ++k) sum += cells[static_cast<std::size_t>(k)];
    CAPTURE(line);
    CHECK(std::abs(sum - cells[6]) <= 7 * 0.005 * 1024 * 1024 * 1024);  // 7 cells of 0.01 GiB
    ++rows;
  }
  CHECK(rows == 4);
}

// A pipeline's compute is its step stage's (the last to finish its optimizer step): its micro-
// batches' forward and backward from the stage table (their compute alone; the walk puts the
// exposed waits between them), plus its optimizer step. From the JSON, and the text says which
// stage.
TEST_CASE("cli_parallel::the step's compute is the step stage's micro-batches and optimizer step") {
  for (const char* schedule : {"1f1b", "interleaved-1f1b"}) {
    std::vector<std::string> flags = {"--tensor-parallel",
                                      "8",
                                      "--sequence-parallel",
                                      "--pipeline-parallel",
                                      "4",
                                      "--micro-batch",
                                      "1",
                                      "--schedule",
                                      schedule};
    if (std::string(schedule) == "interleaved-1f1b")
      flags.insert(flags.end(), {"--virtual-stages", "2"});
    auto json_flags = flags;
    json_flags.emplace_back("--format=json");
    const auto r = planner(llama70b(json_flags));
    REQUIRE(r.code == 0);
    const auto j = nlohmann::json::parse(r.out);
    const auto& t = j.at("time");
    const int s = t.at("step_stage").get<int>();
    const auto& stage = j.at("stages").at(static_cast<std::size_t>(s));
    const double m = j.at("parallelism").at("micro_batches").get<double>();
    const double compute =
        m * (stage.at("forward_s").get<double>() + stage.at("backward_s").get<double>()) +
        t.at("optimizer_s").get<double>();
    CAPTURE(schedule);
    CHECK(t.at("compute_s").get<double>() == doctest::Approx(compute).epsilon(1e-9));
    const auto text = planner(llama70b(flags));
    REQUIRE(text.code == 0);
    CHECK(has(text.out, "    of stage " + std::to_string(s) + ", the last to finish: "));
  }
}

TEST_CASE("cli_parallel::async tensor parallelism keeps its framework's communication buffers") {
  // Llama-3-8B (h 4096), 4,096 tokens a micro-batch, bf16 (e = 2), t = 2 with sequence
  // parallelism. Derived from the sources (costmodel/parallel_memory.cpp, async_tp_bytes):
  // torch's micro-pipeline TP (torchtitan) keeps one symmetric-memory workspace of two output
  // chunks [T/t, h]: 2 * 2 * 4096 * 4096 / 2 = 33,554,432 bytes; Transformer Engine's userbuffers
  // (Megatron-LM's --tp-comm-overlap) 12 buffers [T, h]: 12 * 2 * 4096 * 4096 = 402,653,184.
  auto buffers = [](const char* recipe, bool async) {
    std::vector<std::string> args = {"estimate",
                                     "--model",
                                     "llama-3-8b",
                                     "--hardware",
                                     "h100-sxm5-80gb",
                                     "--gpus",
                                     "8",
                                     "--seq-len",
                                     "4096",
                                     "--global-batch",
                                     "4",
                                     "--micro-batch",
                                     "1",
                                     "--strategy",
                                     "fsdp-full",
                                     "--recipe",
                                     recipe,
                                     "--tensor-parallel",
                                     "2",
                                     "--sequence-parallel",
                                     "--format",
                                     "json"};
    if (async) args.emplace_back("--async-tensor-parallel");
    const auto r = planner(args);
    INFO(r.err);
    REQUIRE(r.code == 0);
    const auto memory = nlohmann::json::parse(r.out).at("memory");
    return std::pair{memory.at("breakdown").at("overhead").get<double>(),
                     memory.at("allocated_peak_bytes").get<double>()};
  };
  // Outside the caching allocator: the overhead grows by them, the allocated peak does not.
  const auto [async_overhead, async_allocated] = buffers("torchtitan", true);
  const auto [overhead, allocated] = buffers("torchtitan", false);
  CHECK(async_overhead - overhead == 33554432.0);
  CHECK(async_allocated == allocated);
  // transformers' tp_plan has no async mode (nor sequence parallelism): refused, naming the flags.
  const auto hf = planner({"estimate", "--model", "llama-3-8b", "--gpus", "8", "--global-batch",
                           "8", "--strategy", "ddp", "--recipe", "hf", "--tensor-parallel", "2",
                           "--sequence-parallel", "--async-tensor-parallel"});
  CHECK(hf.code == 2);
  CHECK(hf.err ==
        "planner: --tensor-parallel 2 --sequence-parallel --async-tensor-parallel: the hf "
        "recipe's trainer runs no sequence parallelism (asked for 2); the recipes that do: "
        "torchtitan, megatron, executor; the hf recipe's tensor parallelism has no async mode\n");
  const auto [te_overhead, te_allocated] = buffers("megatron", true);
  const auto [megatron_overhead, megatron_allocated] = buffers("megatron", false);
  CHECK(te_overhead - megatron_overhead == 402653184.0);
  CHECK(te_allocated == megatron_allocated);
}

// Each recipe's pipeline runs the schedules its code has (RecipeTraits::schedules): Megatron-LM's
// get_forward_backward_func picks 1F1B or its interleaved schedule, no GPipe
// (megatron/core/pipeline_parallel/schedules.py); DeepSpeed's PipelineEngine runs its
// TrainSchedule, a 1F1B (deepspeed/runtime/pipe/schedule.py); torchtitan's has all three.
TEST_CASE("cli_parallel::a recipe's pipeline runs only the schedules its code has") {
  refused({"--tensor-parallel", "8", "--pipeline-parallel", "4", "--schedule", "gpipe"},
          "--tensor-parallel 8 --pipeline-parallel 4 --schedule gpipe: the megatron recipe's "
          "pipeline has no gpipe schedule (it has 1f1b, interleaved-1f1b)");
  for (const char* schedule : {"gpipe", "interleaved-1f1b"}) {
    std::vector<std::string> a = {"estimate", "--model",        "llama-2-7b", "--gpus",
                                  "8",        "--seq-len",      "4096",       "--micro-batch",
                                  "1",        "--global-batch", "64",         "--strategy",
                                  "zero1",    "--recipe",       "deepspeed",  "--pipeline-parallel",
                                  "2",        "--schedule",     schedule};
    if (std::string(schedule) == "interleaved-1f1b") a.insert(a.end(), {"--virtual-stages", "2"});
    const auto r = planner(a);
    CAPTURE(schedule);
    CHECK(r.code == 2);
    CHECK(has(r.err, std::string("the deepspeed recipe's pipeline has no ") + schedule +
                         " schedule (it has 1f1b)"));
  }
  for (const char* schedule : {"1f1b", "interleaved-1f1b", "gpipe"}) {
    std::vector<std::string> a = {
        "estimate",  "--model",        "llama-2-7b", "--gpus",
        "8",         "--seq-len",      "4096",       "--micro-batch",
        "1",         "--global-batch", "64",         "--strategy",
        "fsdp-full", "--recipe",       "torchtitan", "--pipeline-parallel",
        "2",         "--schedule",     schedule};
    if (std::string(schedule) == "interleaved-1f1b") a.insert(a.end(), {"--virtual-stages", "2"});
    CAPTURE(schedule);
    CHECK(planner(a).code == 0);
  }
}

// DeepSpeed's PipelineEngine asserts ZeRO stage < 2 (deepspeed/runtime/pipe/engine.py, 0.19.8:
// "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism", measured by
// validation/measure_deepspeed_pipeline.py's refusal probe); FSDP2 under the same recipe runs.
TEST_CASE("cli_parallel::DeepSpeed's pipeline engine refuses ZeRO-2, ZeRO-3 and FSDP") {
  for (const char* strategy : {"zero2", "zero3"}) {
    const auto r = planner({"estimate", "--model", "llama-2-7b", "--gpus", "8", "--seq-len", "4096",
                            "--micro-batch", "1", "--global-batch", "64", "--strategy", strategy,
                            "--recipe", "deepspeed", "--pipeline-parallel", "2"});
    CAPTURE(strategy);
    CHECK(r.code == 2);
    CHECK(r.out.empty());
    CHECK(has(r.err, std::string("DeepSpeed's pipeline engine runs ZeRO stage 0 or 1 only, not ") +
                         strategy + " (deepspeed)"));
  }
  // Under --recipe deepspeed the engine runs the pipeline: no FSDP beside it.
  const auto fsdp = planner({"estimate", "--model", "llama-2-7b", "--gpus", "8", "--seq-len",
                             "4096", "--micro-batch", "1", "--global-batch", "64", "--strategy",
                             "fsdp-full", "--recipe", "deepspeed", "--pipeline-parallel", "2"});
  CHECK(fsdp.code == 2);
  CHECK(has(fsdp.err, "DeepSpeed's pipeline engine runs ZeRO stage 0 or 1 only, not fsdp-full "
                      "(fsdp2)"));
  CHECK(planner({"estimate", "--model", "llama-2-7b", "--gpus", "8", "--seq-len", "4096",
                 "--micro-batch", "1", "--global-batch", "64", "--strategy", "zero1", "--recipe",
                 "deepspeed", "--pipeline-parallel", "2"})
            .code == 0);
}
