// `recommend --emit llm-foundry`: the train YAML keys the plan was costed with, through the command
// line. llm-foundry's own config code reads them in llm_foundry_config_parse.py (CMakeLists.txt).
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli_fixture.hpp"

namespace {

using shardplan::planner::testing::planner;
namespace fs = std::filesystem;

// An MPT-7B-shaped config.json (ALiBi, no biases, flash attention), written where the planner
// reads it.
struct MptFile {
  // One directory per process: ctest runs this file's cases side by side.
  fs::path dir =
      fs::temp_directory_path() / ("shardplan_emit_llm_foundry_" + std::to_string(::getpid()));
  std::string path = (dir / "mpt.json").string();
  MptFile() {
    fs::create_directories(dir);
    std::ofstream(path) << R"({"architectures": ["MPTForCausalLM"], "model_type": "mpt",
      "d_model": 4096, "n_heads": 32, "n_layers": 32, "expansion_ratio": 4, "max_seq_len": 2048,
      "vocab_size": 50368, "no_bias": true, "attn_config": {"attn_impl": "flash", "alibi": true}})";
  }
  MptFile(const MptFile&) = delete;
  MptFile& operator=(const MptFile&) = delete;
  ~MptFile() { fs::remove_all(dir); }
};

std::vector<std::string> job(const std::string& model, std::vector<std::string> more) {
  std::vector<std::string> a = {
      "recommend",      "--model",        model,        "--gpus",   "8",           "--seq-len",
      "2048",           "--global-batch", "48",         "--recipe", "llm-foundry", "--hardware",
      "h100-sxm5-80gb", "--emit",         "llm-foundry"};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("emit_llm_foundry::the YAML carries the batch, precision, fsdp_config and MPT's model") {
  const MptFile mpt;
  const auto r = planner(job(mpt.path, {"--fsdp-mixed-precision", "full", "--micro-batch", "2",
                                        "--checkpointing", "full"}));
  INFO(r.err);
  REQUIRE(r.code == 0);
  // 48 sequences over 8 GPUs in micro-batches of 2: 3 accumulation steps.
  CHECK(has(r.out, "# micro-batch 2 x 3 accumulation, checkpointing full; predicted peak "));
  for (const char* line :
       {"max_seq_len: 2048\n", "global_train_batch_size: 48\n", "device_train_microbatch_size: 2\n",
        "precision: \"amp_bf16\"\n", "fsdp_config:\n", "  sharding_strategy: \"FULL_SHARD\"\n",
        "  mixed_precision: \"FULL\"\n", "  activation_checkpointing: true\n",
        "  activation_checkpointing_reentrant: false\n", "  backward_prefetch: \"BACKWARD_PRE\"\n",
        "  limit_all_gathers: true\n", "model:\n  name: \"mpt_causal_lm\"\n",
        "    attn_impl: \"flash\"\n", "  d_model: 4096\n", "  loss_fn: \"fused_crossentropy\"\n"})
    CHECK_MESSAGE(has(r.out, line), line);
  CHECK_FALSE(has(r.out, "architectures"));  // the export's keys are not MPTConfig's
  // A Hugging Face model keeps the user's hf_causal_lm section; HSDP names its two degrees.
  const auto llama =
      planner({"recommend", "--model", "llama-2-7b", "--gpus", "16", "--gpus-per-node", "8",
               "--seq-len", "4096", "--global-batch", "64", "--recipe", "llm-foundry", "--strategy",
               "hsdp", "--hardware", "h100-sxm5-80gb", "--emit", "llm-foundry"});
  REQUIRE(llama.code == 0);
  CHECK(has(llama.out, "# model: your hf_causal_lm section for llama-2-7b"));
  CHECK_FALSE(has(llama.out, "\nmodel:"));
  CHECK(has(llama.out, "  sharding_strategy: \"HYBRID_SHARD\"\n  data_parallel_shard_degree: 8\n"
                       "  data_parallel_replicate_degree: 2\n"));
  CHECK(has(llama.err, "--emit llm-foundry: searching Composer's FSDP plans only"));
}

TEST_CASE("emit_llm_foundry::plans llm-foundry does not run as costed are refused, naming why") {
  const MptFile mpt;
  auto err = [&](std::vector<std::string> args) {
    const auto r = planner(std::move(args));
    CHECK(r.code == 2);
    return r.err;
  };
  auto swap_recipe = job("llama-2-7b", {});
  swap_recipe[10] = "hf";
  CHECK(err(swap_recipe) == "planner: --emit: llm-foundry: recipe hf is not llm-foundry's code; "
                            "plan with --recipe llm-foundry\n");
  CHECK(err(job(mpt.path, {"--flavour", "fsdp2"})) ==
        "planner: --flavour: --emit llm-foundry writes Composer's fsdp_config (FSDP1), got "
        "--flavour fsdp2\n");
  CHECK(err(job(mpt.path, {"--strategy", "zero3"})) ==
        "planner: --strategy: --emit llm-foundry writes Composer's fsdp_config (fsdp-full, "
        "fsdp-grad-op, hsdp), got --strategy zero3\n");
  CHECK(has(err(job(mpt.path, {"--checkpointing", "every:2"})),
            "planner: --emit: llm-foundry: checkpointing every:2: fsdp_config's "
            "activation_checkpointing checkpoints every block or none\n"));
  CHECK(has(err(job(mpt.path, {"--loss", "chunked:4"})),
            "planner: --emit: llm-foundry: loss chunked:4: MPT's loss_fn is fused_crossentropy "
            "(fused) or torch_crossentropy (upcast)\n"));
  CHECK(has(err(job(mpt.path, {"--model-parallel"})), "planner: --emit: with --model-parallel"));
}
