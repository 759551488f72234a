// --compile: torch.compile as the recipe's trainer applies it (torchtitan's apply_compile), what
// the walk counts for it, what it refuses, and what the emitters write.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "cli_fixture.hpp"
#include "documents/job.hpp"
#include "tests/test_support.hpp"

using namespace shardplan::documents;
using shardplan::planner::testing::planner;

namespace {

std::vector<std::string> titan(std::vector<std::string> more) {
  std::vector<std::string> a = {"estimate",
                                "--model",
                                "llama-3-8b",
                                "--hardware",
                                "h100-sxm5-80gb",
                                "--gpus",
                                "8",
                                "--seq-len",
                                "4096",
                                "--global-batch",
                                "16",
                                "--micro-batch",
                                "1",
                                "--strategy",
                                "fsdp-full",
                                "--recipe",
                                "torchtitan",
                                "--format",
                                "json"};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

// The compiled block keeps fewer tensors (tests/costmodel/test_oracle_compile.cpp checks them
// against the corpus) and the compiled loss no fp32 logits: a lower peak, and fused kernels move
// fewer bytes in the forward: a shorter step.
TEST_CASE("compile::the compiled block and loss: lower peak and step, loss fused") {
  for (const char* ckpt : {"none", "full"}) {
    CAPTURE(ckpt);
    const auto eager = planner(titan({"--checkpointing", ckpt}));
    const auto compiled = planner(titan({"--checkpointing", ckpt, "--compile"}));
    REQUIRE(eager.code == 0);
    REQUIRE(compiled.code == 0);
    const auto e = nlohmann::json::parse(eager.out), c = nlohmann::json::parse(compiled.out);
    CHECK(c.at("loss") == "fused");
    CHECK(c.at("compile") == true);
    CHECK(e.at("compile") == false);
    CHECK(c.at("memory").at("peak_bytes").get<double>() <
          e.at("memory").at("peak_bytes").get<double>());
    CHECK(c.at("time").at("step_s").get<double>() < e.at("time").at("step_s").get<double>());
  }
}

TEST_CASE("compile::refused where what it keeps is not measured") {
  const auto hf = planner({"estimate", "--model", "llama-3-8b", "--gpus", "8", "--seq-len", "4096",
                           "--global-batch", "16", "--recipe", "hf", "--compile"});
  CHECK(hf.code == 2);
  CHECK(has(hf.err, "--compile: what torch.compile makes recipe hf's block keep is not "
                    "measured; torchtitan's is (--recipe torchtitan)"));
  const auto cp =
      planner(titan({"--compile", "--checkpointing", "none", "--context-parallel", "2"}));
  CHECK(cp.code == 2);
  CHECK(has(cp.err, "--compile: what a compiled block keeps under context parallelism is not "
                    "measured (one rank's block is, and torchtitan's under tensor parallelism)"));
}

// Compiled under torchtitan's tensor parallelism with sequence parallelism, its default (refused
// before): the one-rank compiled block's tensors split as TP splits them, the norms' outputs kept
// gathered (tests/costmodel/data/oracle_tp_units.json, 12 compiled cases within 0.4% through the
// walk's block: tests/costmodel/test_parallel_memory_oracle.cpp). Without checkpointing and with
// the save list, a compiled block keeps less than an eager one (4,308 against 5,524 and 1,872
// against 2,128 bytes a token in the corpus's block), so the step's peak is lower.
TEST_CASE("compile::under torchtitan's tensor parallelism") {
  for (const char* ckpt : {"none", "selective-op"}) {
    CAPTURE(ckpt);
    const auto peak = [&](std::vector<std::string> more) {
      for (const char* a :
           {"--checkpointing", ckpt, "--tensor-parallel", "2", "--sequence-parallel"})
        more.emplace_back(a);
      const auto r = planner(titan(std::move(more)));
      REQUIRE_MESSAGE(r.code == 0, r.err);
      return nlohmann::json::parse(r.out).at("memory").at("peak_bytes").get<double>();
    };
    CHECK(peak({"--compile"}) < peak({"--loss", "fused"}));
  }
}

// torchtitan's default checkpointing, its op-level save list, inside the compiled graph: the
// partition keeps what the policy saves and the backward reads, so not w2's output, which only
// the residual sum takes (the bytes per block: tests/costmodel/test_oracle_float8.cpp). Its peak
// lies between the compiled block's under full checkpointing and without any, and below eager's.
TEST_CASE("compile::torchtitan's op-level save list inside the compiled block") {
  const auto peak = [](std::vector<std::string> more) {
    const auto r = planner(titan(std::move(more)));
    REQUIRE(r.code == 0);
    const auto d = nlohmann::json::parse(r.out);
    return d.at("memory").at("peak_bytes").get<double>();
  };
  const double op = peak({"--compile"});
  CHECK(op < peak({"--loss", "fused"}));
  CHECK(op > peak({"--compile", "--checkpointing", "full"}));
  CHECK(op < peak({"--compile", "--checkpointing", "none"}));
}

TEST_CASE("compile::the job document carries it, the emitted configs enable it") {
  nlohmann::json doc = {{"schema_version", 1},
                        {"seq_len", 128},
                        {"global_batch", 8},
                        {"recipe", "torchtitan"},
                        {"compile", true}};
  const TrainingJob j = job_from_json(doc);
  CHECK(j.compile);
  CHECK(job_to_json(j).at("compile") == true);
  doc["compile"] = "yes";
  CHECK_THROWS_AS(job_from_json(doc), shardplan::core::InputError);
  const auto emitted =
      planner({"recommend", "--model", "llama-3-8b", "--gpus", "8", "--seq-len", "4096",
               "--global-batch", "16", "--recipe", "torchtitan", "--compile", "--checkpointing",
               "full", "--hardware", "h100-sxm5-80gb", "--emit", "fsdp"});
  REQUIRE(emitted.code == 0);
  CHECK(has(emitted.out, "block.compile(backend=\"inductor\", fullgraph=True)"));
  CHECK(has(emitted.out, "[compile]\nenable = true"));
  CHECK(has(emitted.out, "--compile.enable"));
  CHECK(!has(emitted.err, "needs the loss fused"));
}

TEST_CASE("compile::--fsdp2-groups takes root or ends") {
  const auto bad = planner({"estimate", "--model", "gpt2", "--gpus", "2", "--seq-len", "128",
                            "--global-batch", "2", "--fsdp2-groups", "blocks"});
  CHECK(bad.code == 2);
  CHECK(bad.err == "planner: --fsdp2-groups: must be one of root, ends, got \"blocks\"\n");
  auto hf = [](std::vector<std::string> more) {
    std::vector<std::string> a = {"estimate",
                                  "--model",
                                  "llama-3-8b",
                                  "--hardware",
                                  "h100-sxm5-80gb",
                                  "--gpus",
                                  "8",
                                  "--seq-len",
                                  "4096",
                                  "--global-batch",
                                  "16",
                                  "--micro-batch",
                                  "1",
                                  "--strategy",
                                  "fsdp-full",
                                  "--flavour",
                                  "fsdp2",
                                  "--format",
                                  "json"};
    a.insert(a.end(), more.begin(), more.end());
    return planner(a);
  };
  const auto root = hf({"--fsdp2-groups", "root"});
  const auto ends = hf({});
  REQUIRE(root.code == 0);
  REQUIRE(ends.code == 0);
  // hf's own (accelerate's) groups gather fewer parameters at once than a root holding the
  // embeddings with the head.
  CHECK(nlohmann::json::parse(ends.out).at("memory").at("peak_bytes").get<double>() <
        nlohmann::json::parse(root.out).at("memory").at("peak_bytes").get<double>());
}
