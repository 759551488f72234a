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

TEST_CASE(
    "recipes::Megatron's DDP and distributed optimizer keep 18 and 6 + 12/d bytes a parameter") {
  // Megatron-LM's own count (megatron/training/theoretical_memory_usage.py): under --bf16 a
  // parameter keeps its bf16 weight (2), its fp32 main gradient (4) and the optimizer's fp32 main
  // weight and Adam moments (12), 18 bytes; the distributed optimizer shards the 12 over the d
  // data-parallel ranks. Llama-3-8B has 8,030,261,248 parameters (the hub's count).
  const double P = 8030261248.0;
  auto run = [](const char* strategy, const char* t) {
    return estimate({"--model", "llama-3-8b", "--gpus", "8", "--seq-len", "4096", "--global-batch",
                     "64", "--micro-batch", "1", "--recipe", "megatron", "--strategy", strategy,
                     "--tensor-parallel", t, "--hardware", "h100-sxm5-80gb"});
  };
  const auto ddp = run("ddp", "1"), zero1 = run("zero1", "1");
  // The recipe's own engine when no flavour is named.
  CHECK(ddp.at("flavour") == "megatron");
  CHECK(zero1.at("flavour") == "megatron");
  const auto& a = ddp.at("memory").at("model_states");
  CHECK(a.at("parameters").get<double>() == 2 * P);
  CHECK(a.at("gradients").get<double>() == 4 * P);
  CHECK(a.at("optimizer_states").get<double>() == 12 * P);
  const auto& b = zero1.at("memory").at("model_states");
  CHECK(b.at("parameters").get<double>() == 2 * P);
  CHECK(b.at("gradients").get<double>() == 4 * P);
  CHECK(b.at("optimizer_states").get<double>() == doctest::Approx(12 * P / 8).epsilon(1e-12));
  // The main-gradient buffer exists from the start: it is at the peak whole, in the forward too.
  CHECK(ddp.at("memory").at("breakdown").at("gradients").get<double>() == 4 * P);
  // Without overlap_grad_reduce the buffer is all-reduced once after the backward, in fp32: a
  // ring all-reduce sends 2 (n - 1) / n of it, all of it exposed.
  CHECK(ddp.at("comm").at("bytes_per_gpu").get<double>() ==
        doctest::Approx(2.0 * 7 / 8 * 4 * P).epsilon(1e-12));
  const auto& time = ddp.at("time");
  CHECK(time.at("exposed_by_stream_s").at("all-reduce").get<double>() ==
        doctest::Approx(time.at("step_s").get<double>() - time.at("compute_s").get<double>()));
  // Over two tensor-parallel ranks (the model-parallel stage's count): per rank the same 2 + 4
  // bytes of its local parameters, 12 sharded over the d = 4 replicas.
  const auto tp = run("zero1", "2").at("memory").at("model_states");
  const double local = tp.at("parameters").get<double>() / 2;
  CHECK(tp.at("gradients").get<double>() == 4 * local);
  CHECK(tp.at("optimizer_states").get<double>() == doctest::Approx(12 * local / 4).epsilon(1e-12));
}

TEST_CASE("recipes::an engine the recipe does not run is refused, naming the flag") {
  using shardplan::planner::testing::planner;
  const std::vector<std::string> job = {"estimate",  "--model", "llama-3-8b",     "--gpus", "8",
                                        "--seq-len", "4096",    "--global-batch", "64"};
  auto with = [&](std::vector<std::string> more) {
    auto args = job;
    args.insert(args.end(), more.begin(), more.end());
    return planner(args);
  };
  const auto hf = with({"--recipe", "hf", "--strategy", "ddp", "--flavour", "megatron"});
  CHECK(hf.code == 2);
  CHECK(hf.err == "planner: --flavour: megatron: recipe hf runs under ddp or fsdp2 or fsdp1 or "
                  "deepspeed\n");
  const auto zero2 = with({"--recipe", "megatron", "--strategy", "zero2", "--flavour", "megatron"});
  CHECK(zero2.code == 2);
  CHECK(zero2.err == "planner: --flavour: zero2 is not implemented by megatron; use deepspeed\n");
  const auto offload =
      with({"--recipe", "megatron", "--strategy", "zero1", "--offload", "optimizer"});
  CHECK(offload.code == 2);
  CHECK(offload.err ==
        "planner: --offload: Megatron-core's optimizer offload (--optimizer-cpu-offload) is not "
        "modeled\n");
}

TEST_CASE("recipes::llm-foundry's FSDP reduces in fp32 unless told otherwise") {
  // Composer's default mixed precision for FSDP, "DEFAULT" (composer/distributed/
  // mosaic_parallelism.py, get_mixed_precision): param_dtype the autocast dtype, reduce_dtype fp32;
  // "PURE" reduces in bf16 (--reduce-dtype bf16). transformers' Trainer and accelerate reduce in
  // the parameters' dtype.
  using shardplan::planner::testing::planner;
  auto emitted = [](const char* recipe, const char* reduce) {
    std::vector<std::string> args = {"recommend", "--model", "llama-2-7b", "--gpus",    "8",
                                     "--recipe",  recipe,    "--strategy", "fsdp-full", "--flavour",
                                     "fsdp1",     "--emit",  "fsdp"};
    if (*reduce != '\0') args.insert(args.end(), {"--reduce-dtype", reduce});
    const auto r = planner(args);
    INFO(r.err);
    REQUIRE(r.code == 0);
    return r.out;
  };
  const auto has = [](const std::string& text, const char* part) {
    return text.find(part) != std::string::npos;
  };
  CHECK(has(emitted("llm-foundry", ""),
            "MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)"));
  CHECK(has(emitted("llm-foundry", "bf16"),
            "MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)"));
  CHECK(has(emitted("hf", ""),
            "MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)"));
}

TEST_CASE("recipes::Megatron's --overlap-grad-reduce is searched: buckets beside the backward") {
  // Megatron-core reduces its main-gradient buffer once after the backward unless
  // --overlap-grad-reduce, which reduces buckets of max(40e6, 1e6 x 16) = 40e6 fp32 elements
  // (152.6 MiB) beside it (distributed_data_parallel.py). The search offers both; with 16 ranks the
  // overlapped plan hides most of the reduce-scatter and wins.
  using shardplan::planner::testing::planner;
  const std::vector<std::string> job = {
      "--model",    "llama-3-8b",      "--gpus",     "16",       "--seq-len",
      "4096",       "--global-batch",  "64",         "--recipe", "megatron",
      "--hardware", "h100-sxm5-80gb",  "--strategy", "zero1",    "--micro-batch",
      "4",          "--checkpointing", "full"};
  auto args = [&](const char* command) {
    std::vector<std::string> a = {command};
    a.insert(a.end(), job.begin(), job.end());
    a.insert(a.end(), {"--format", "json"});
    return a;
  };
  const auto rec = planner(args("recommend"));
  REQUIRE(rec.code == 0);
  const auto best = nlohmann::json::parse(rec.out).at("recommendation");
  const auto once = estimate(std::vector<std::string>(job.begin(), job.end()));
  CHECK(best.at("flavour") == "megatron");
  const double overlapped = best.at("time").at("exposed_by_stream_s").at("reduce-scatter");
  const double after = once.at("time").at("exposed_by_stream_s").at("reduce-scatter");
  CHECK(overlapped < after);
  CHECK(best.at("time").at("step_s").get<double>() < once.at("time").at("step_s").get<double>());
  // The memory is the same buffer either way.
  CHECK(best.at("memory").at("breakdown") == once.at("memory").at("breakdown"));
  const auto text =
      planner({"recommend", "--model", "llama-3-8b", "--gpus", "16", "--seq-len", "4096",
               "--global-batch", "64", "--recipe", "megatron", "--hardware", "h100-sxm5-80gb",
               "--strategy", "zero1", "--micro-batch", "4", "--checkpointing", "full"});
  CHECK(text.out.find("zero1 (megatron), mb 4x1, ckpt full, loss fp32-inplace, bucket 153 MiB") !=
        std::string::npos);
}
