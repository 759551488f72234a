// Recipes that run the same model code keep the same tensors: a recipe is a row of
// documents/recipe.hpp, and what its model code keeps follows the row's fields, not its name.
// Through the command line, as users run it.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
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
  // sdpa an explicit mask, which it keeps (costmodel/block_table.cpp, sdpa_gets_mask). A model
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

TEST_CASE("recipes::FSDP's mixed precision: each recipe's default and the modes Composer names") {
  // Composer's fsdp_config.mixed_precision (composer/distributed/mosaic_parallelism.py,
  // get_mixed_precision), llm-foundry's: DEFAULT (its default) param_dtype the autocast dtype and
  // reduce_dtype fp32; PURE both 16-bit; FULL neither (fp32 parameters gathered, autocast
  // computing). accelerate's FSDP plugin (utils/dataclasses.py, set_mixed_precision) sets
  // param_dtype and reduce_dtype to the mixed precision's dtype: PURE.
  using shardplan::planner::testing::planner;
  auto emitted = [](const char* recipe, const char* mode) {
    std::vector<std::string> args = {"recommend", "--model", "llama-2-7b", "--gpus",    "8",
                                     "--recipe",  recipe,    "--strategy", "fsdp-full", "--flavour",
                                     "fsdp1",     "--emit",  "fsdp"};
    if (*mode != '\0') args.insert(args.end(), {"--fsdp-mixed-precision", mode});
    const auto r = planner(args);
    INFO(r.err);
    REQUIRE(r.code == 0);
    return r.out;
  };
  const auto has = [](const std::string& text, const char* part) {
    return text.find(part) != std::string::npos;
  };
  CHECK(has(emitted("llm-foundry", "default"),
            "MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)"));
  CHECK(has(emitted("llm-foundry", "pure"),
            "MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)"));
  const std::string full = emitted("llm-foundry", "full");
  CHECK(has(full, "MixedPrecision(param_dtype=torch.float32, reduce_dtype=torch.float32)"));
  CHECK(has(full, "# forward and loss under torch.autocast(\"cuda\", dtype=torch.bfloat16)"));
  // torchtitan's options cannot say it: no autocast under its FSDP.
  CHECK(has(full, "mixed_precision_param: torchtitan runs no autocast under FSDP"));
  CHECK(has(emitted("hf", ""),
            "MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)"));
  // --reduce-dtype sets the reduction alone, as Composer's dict form does.
  const auto r = planner({"recommend", "--model", "llama-2-7b", "--gpus", "8", "--recipe",
                          "llm-foundry", "--strategy", "fsdp-full", "--flavour", "fsdp1", "--emit",
                          "fsdp", "--fsdp-mixed-precision", "full", "--reduce-dtype", "bf16"});
  CHECK(has(r.out, "MixedPrecision(param_dtype=torch.float32, reduce_dtype=torch.bfloat16)"));
}

TEST_CASE("recipes::FSDP's mixed precision modes move and keep what their dtypes say") {
  // llama-2-7b, 8 GPUs, FSDP1 full shard under llm-foundry. The collectives move the same
  // elements in every mode, 4 bytes each in fp32 and 2 in bf16: FULL gathers twice DEFAULT's
  // bytes and reduces as many; PURE reduces half. The sharded states (fp32 parameter, its fp32
  // gradient, AdamW's two fp32 moments) are the same in every mode.
  const std::vector<std::string> job = {"--model",        "llama-2-7b",
                                        "--gpus",         "8",
                                        "--seq-len",      "2048",
                                        "--micro-batch",  "2",
                                        "--global-batch", "64",
                                        "--strategy",     "fsdp-full",
                                        "--flavour",      "fsdp1",
                                        "--recipe",       "llm-foundry",
                                        "--hardware",     "h100-sxm5-80gb"};
  auto run = [&](const char* mode) {
    auto args = job;
    args.insert(args.end(), {"--fsdp-mixed-precision", mode});
    return estimate(args);
  };
  const auto def = run("default"), pure = run("pure"), full = run("full");
  CHECK(def.at("fsdp_mixed_precision") == "default");
  CHECK(full.at("fsdp_mixed_precision") == "full");
  CHECK(pure.at("reduce_dtype") == "bf16");
  auto bytes = [](const nlohmann::json& e, const char* c) {
    return e.at("comm").at("bytes_by_collective").at(c).get<double>();
  };
  CHECK(bytes(full, "all_gather") == 2 * bytes(def, "all_gather"));
  CHECK(bytes(pure, "all_gather") == bytes(def, "all_gather"));
  CHECK(bytes(full, "reduce_scatter") == bytes(def, "reduce_scatter"));
  CHECK(bytes(def, "reduce_scatter") == 2 * bytes(pure, "reduce_scatter"));
  CHECK(full.at("memory").at("model_states") == def.at("memory").at("model_states"));
  CHECK(pure.at("memory").at("model_states") == def.at("memory").at("model_states"));
  // FULL keeps autocast's 16-bit copy of every weight from its forward to its backward (as DDP's
  // autocast does) and gathers 4-byte units: its peak is above DEFAULT's.
  CHECK(full.at("memory").at("peak_bytes").get<double>() >
        def.at("memory").at("peak_bytes").get<double>());
  CHECK(pure.at("time").at("step_s").get<double>() <= def.at("time").at("step_s").get<double>());
}

TEST_CASE("recipes::FSDP's mixed precision is refused where the job cannot run it") {
  using shardplan::planner::testing::planner;
  const std::vector<std::string> job = {"estimate",  "--model", "llama-2-7b",     "--gpus", "8",
                                        "--seq-len", "2048",    "--global-batch", "64"};
  auto err = [&](std::vector<std::string> more) {
    auto args = job;
    args.insert(args.end(), more.begin(), more.end());
    const auto r = planner(args);
    CHECK(r.code == 2);
    return r.err;
  };
  CHECK(err({"--strategy", "fsdp-full", "--fsdp-mixed-precision", "half"}) ==
        "planner: --fsdp-mixed-precision: must be one of default, pure, full, got \"half\"\n");
  CHECK(err({"--strategy", "fsdp-full", "--precision", "fp32", "--fsdp-mixed-precision", "full"}) ==
        "planner: --fsdp-mixed-precision: full: FSDP's mixed precision modes are "
        "of a bf16-mixed or fp16-mixed job; this one is fp32\n");
  CHECK(err({"--strategy", "fsdp-full", "--recipe", "torchtitan", "--fsdp-mixed-precision",
             "full"}) == "planner: --fsdp-mixed-precision: full: recipe torchtitan runs no "
                         "autocast under FSDP, so fp32 parameters compute in fp32 (state "
                         "--precision fp32)\n");
  CHECK(err({"--strategy", "fsdp-full", "--recipe", "torchtitan", "--fsdp-mixed-precision",
             "pure"}) ==
        "planner: --fsdp-mixed-precision: pure: torchtitan reduces gradients in fp32 only\n");
  CHECK(err({"--strategy", "zero3", "--recipe", "llm-foundry", "--fsdp-mixed-precision", "pure"}) ==
        "planner: --fsdp-mixed-precision: pure: zero3 runs under deepspeed, not FSDP\n");
  // From a job file, the message names the file's key.
  const auto dir = fs::temp_directory_path() / "shardplan_fsdp_mp_job";
  fs::create_directories(dir);
  const auto path = (dir / "job.json").string();
  std::ofstream(path) << R"({"schema_version": 1, "seq_len": 2048, "global_batch": 64,
                           "precision": "fp32", "fsdp_mixed_precision": "pure"})";
  const auto r = planner({"estimate", "--model", "llama-2-7b", "--gpus", "8", "--strategy",
                          "fsdp-full", "--job", path});
  CHECK(r.code == 2);
  CHECK(r.err.find(": /fsdp_mixed_precision: pure: FSDP's mixed precision modes are of a "
                   "bf16-mixed or fp16-mixed job; this one is fp32") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("recipes::recommend tries Composer's PURE beside llm-foundry's DEFAULT and says so") {
  using shardplan::planner::testing::planner;
  const std::vector<std::string> job = {
      "recommend",   "--model",    "llama-2-7b",     "--gpus",   "8",
      "--seq-len",   "2048",       "--global-batch", "64",       "--recipe",
      "llm-foundry", "--hardware", "h100-sxm5-80gb", "--format", "json"};
  const auto r = planner(job);
  REQUIRE(r.code == 0);
  const auto doc = nlohmann::json::parse(r.out);
  std::set<std::string> modes;
  for (const auto& c : doc.at("candidates"))
    if (c.contains("fsdp_mixed_precision")) modes.insert(c.at("fsdp_mixed_precision"));
  for (const auto& c : doc.at("pareto"))
    if (c.contains("fsdp_mixed_precision")) modes.insert(c.at("fsdp_mixed_precision"));
  CHECK(modes.count("pure") == 1);
  const auto& best = doc.at("recommendation");
  REQUIRE(best.contains("fsdp_mixed_precision"));
  // A plan in another mode than the recipe's says so first; one in the recipe's says nothing.
  const bool other = best.at("fsdp_mixed_precision") != "default";
  CHECK(doc.contains("requires") == other);
  if (other)
    CHECK(doc.at("requires").dump().find("not recipe llm-foundry's DEFAULT") != std::string::npos);
  // Named, the mode pins the search: FSDP plans only, every one in that mode.
  auto pinned = job;
  pinned.insert(pinned.end(), {"--fsdp-mixed-precision", "default"});
  const auto p = nlohmann::json::parse(planner(pinned).out);
  for (const auto& c : p.at("candidates")) {
    CHECK(c.at("fsdp_mixed_precision") == "default");
    CHECK((c.at("flavour") == "fsdp1" || c.at("flavour") == "fsdp2"));
  }
  CHECK_FALSE(p.contains("requires"));
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

TEST_CASE("recipes::Megatron's --overlap-grad-reduce is searched in every layout") {
  // The layout search tries each Megatron plan (its DDP, its distributed optimizer) reduced once
  // after the backward (Megatron-LM's default) and in buckets beside it, sized for the layout's
  // data- and context-parallel ranks (with_overlap_grad_reduce). Every overlapped plan has its
  // twin reduced after the backward, with the same layout, micro-batch and checkpointing.
  using shardplan::planner::testing::planner;
  const auto r =
      planner({"recommend", "--model", "llama-3-8b", "--gpus", "16", "--seq-len", "4096",
               "--global-batch", "64", "--recipe", "megatron", "--hardware", "h100-sxm5-80gb",
               "--model-parallel", "--top", "5000", "--format", "json"});
  REQUIRE(r.code == 0);
  const auto doc = nlohmann::json::parse(r.out);
  auto key = [](const nlohmann::json& c) {
    return c.at("strategy").dump() + c.at("parallelism").dump() + c.at("micro_batch").dump() +
           c.at("checkpointing").dump();
  };
  std::map<std::string, double> after_backward;
  int overlapped = 0;
  for (const auto& c : doc.at("ranked"))
    if (c.at("flavour") == "megatron" &&
        c.at("megatron").get<std::string>().find("--overlap-grad-reduce") == std::string::npos)
      after_backward[key(c)] = c.at("time").at("step_s").get<double>();
  for (const auto& c : doc.at("ranked")) {
    if (c.at("flavour") != "megatron" ||
        c.at("megatron").get<std::string>().find("--overlap-grad-reduce") == std::string::npos)
      continue;
    ++overlapped;
    CHECK(after_backward.count(key(c)) == 1);
  }
  CHECK(overlapped > 0);
  // Here the overlap hides the reduction: the fastest Megatron plan is an overlapped one.
  for (const auto& c : doc.at("ranked"))
    if (c.at("flavour") == "megatron") {
      CHECK(c.at("megatron").get<std::string>().find("--overlap-grad-reduce") != std::string::npos);
      break;
    }
}
