// Recipes that run the same model code keep the same tensors: a recipe is a row of
// documents/recipe.hpp, and what its model code keeps follows the row's fields, not its name.
// Through the command line, as users run it.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_fixture.hpp"
#include "documents/model.hpp"

namespace {

using shardplan::planner::testing::estimate;
namespace fs = std::filesystem;

}  // namespace

TEST_CASE("recipes::the recipes that run transformers' model code keep the same activations") {
  // Mistral-7B's 4,096-token sliding window at 8,192 tokens: transformers' masking_utils hands
  // sdpa an explicit mask, which it keeps (costmodel/accounting.cpp, sdpa_gets_mask). A model
  // under the DeepSpeed engine and llm-foundry's hf_causal_lm run the same transformers code, so
  // each keeps what hf keeps, the mask included, under the same engine and loss.
  const std::vector<std::string> job = {
      "--model",        "mistral-7b", "--gpus",        "8",      "--seq-len",  "8192",
      "--global-batch", "8",          "--micro-batch", "1",      "--strategy", "zero2",
      "--flavour",      "deepspeed",  "--loss",        "upcast", "--hardware", "h100-sxm5-80gb"};
  auto with = [&](const char* recipe, const char* seq) {
    auto args = job;
    args.insert(args.end(), {"--recipe", recipe});
    args[5] = seq;
    return estimate(args).at("memory").at("breakdown").at("activations").get<double>();
  };
  for (const char* seq : {"2048", "8192"}) {
    CAPTURE(std::string(seq));
    const double hf = with("hf", seq);
    CHECK(with("deepspeed", seq) == hf);
    CHECK(with("llm-foundry", seq) == hf);
  }
  // The mask is counted, hand-derived against the same model without a window (both peak at the
  // loss's backward, every block's tensors alive): each of the 32 blocks keeps the additive
  // mask, e·T·s = 2·8192·8192 bytes, and k and v widened by repeat_kv from the 1,024 kv columns
  // to the 4,096 query columns, 2·e·T·3072 (a mask takes sdpa's grouping away).
  const fs::path dir = fs::temp_directory_path() / "shardplan-recipes-window";
  fs::create_directories(dir);
  auto config = nlohmann::json::parse(
      std::ifstream(shardplan::documents::data_dir() + "/examples/models/mistral-7b/config.json"));
  config["sliding_window"] = nullptr;
  std::ofstream((dir / "config.json").string()) << config.dump();
  auto args = job;
  args[1] = (dir / "config.json").string();
  args.insert(args.end(), {"--recipe", "hf"});
  const auto windowless = estimate(args).at("memory");
  fs::remove_all(dir);
  CHECK(windowless.at("peak_when") == "backward of the loss: logits gradients");
  const double per_block = 2.0 * 8192 * 8192 + 2.0 * 2 * 8192 * 3072;
  CHECK(with("hf", "8192") - windowless.at("breakdown").at("activations").get<double>() ==
        32 * per_block);
}
