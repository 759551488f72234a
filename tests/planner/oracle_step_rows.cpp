#include "oracle_step_rows.hpp"

#include <fmt/format.h>

#include "documents/breakdown.hpp"
#include "documents/collectives.hpp"
#include "planner/cli.hpp"

namespace shardplan::oracle {

namespace {

using documents::Breakdown;
using documents::Category;

// The corpus's categories (MemTracker's, with FSDPMemTracker's split of parameters, gradients
// and communication buffers) summed into the cost model's.
Breakdown measured_categories(const nlohmann::json& at_peak) {
  Breakdown b{};
  auto add = [&](Category c, const char* key) {
    if (at_peak.contains(key)) b[static_cast<int>(c)] += at_peak.at(key).get<double>();
  };
  add(Category::parameters, "parameters");
  add(Category::parameters, "sharded_parameters");
  add(Category::parameters, "buffers");  // the model's own buffers (rotary inv_freq)
  add(Category::gradients, "gradients");
  add(Category::gradients, "sharded_gradients");
  add(Category::gradients, "unsharded_gradients");
  add(Category::optimizer_states, "optimizer_states");
  add(Category::optimizer_states, "optimizer_temp");
  add(Category::activations, "activations");
  add(Category::activations, "temp");
  add(Category::activations, "inputs");
  add(Category::activations, "other");
  add(Category::buffers, "ddp_gradient_buckets");
  add(Category::buffers, "unsharded_parameters");
  add(Category::buffers, "all_gather");
  add(Category::buffers, "reduce_scatter");
  // DeepSpeed's own buffers, as validation/measure_deepspeed.py labels them.
  add(Category::optimizer_states, "master_parameters");
  add(Category::gradients, "master_gradients");
  add(Category::gradients, "step_temp");
  add(Category::buffers, "gradient_buckets");
  add(Category::buffers, "gradient_allreduce");       // stage 0's flattened run, BF16's cast
  add(Category::gradients, "accumulated_gradients");  // BF16_Optimizer's buffer
  return b;
}

std::string text(const nlohmann::json& c, const char* key) { return c.at(key).get<std::string>(); }

}  // namespace

std::vector<std::string> estimate_args(const nlohmann::json& c) {
  const int world = c.at("world_size").get<int>();
  const auto micro = c.at("micro_batch").get<std::int64_t>();
  std::vector<std::string> a = {
      "estimate", "--format=json",
      // The profile whose CUDA context and fragmentation reserve the
      // allocated peak leaves out: any would do.
      "--hardware=a100-sxm4-80gb", fmt::format("--gpus={}", world),
      fmt::format("--gpus-per-node={}", world),
      fmt::format("--seq-len={}", c.at("seq_len").get<std::int64_t>()),
      fmt::format("--micro-batch={}", micro), fmt::format("--global-batch={}", micro * world),
      "--precision=" + text(c, "precision"), "--attention=" + text(c, "attention"),
      "--loss=" + text(c, "loss"), "--checkpointing=" + text(c, "checkpointing"),
      "--optimizer=" + text(c, "optimizer"), "--recipe=" + c.value("recipe", std::string("hf"))};
  const std::string wrapper = text(c, "wrapper");
  if (wrapper.rfind("deepspeed-", 0) == 0) {
    // The config the engine ran says the stage, the buckets and the dtypes (--deepspeed); the
    // batch and the precision come from it too, so those flags would be refused beside it.
    std::erase_if(a, [](const std::string& s) {
      return s.rfind("--micro-batch=", 0) == 0 || s.rfind("--precision=", 0) == 0;
    });
    return a;
  }
  if (wrapper == "none") {
    a.emplace_back("--strategy=none");
  } else if (wrapper == "ddp") {
    a.emplace_back("--strategy=ddp");
  } else if (wrapper == "fsdp2" && c.value("framework", std::string()) == "accelerate") {
    // accelerate's own FSDP2 preparation (validation/measure_accelerate_steps.py): the hf
    // recipe's groups (accelerate's), and the mixed precision it set (PURE under bf16, none in
    // fp32).
    a.insert(a.end(), {"--strategy=fsdp-full", "--flavour=fsdp2"});
    if (c.contains("fsdp_mixed_precision") && !c.at("fsdp_mixed_precision").is_null())
      a.push_back("--fsdp-mixed-precision=" + text(c, "fsdp_mixed_precision"));
  } else if (wrapper == "fsdp2") {
    // The harness's MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), fully_shard on
    // each decoder layer, then on the model (validation/fsdp2_on_gloo.py).
    a.insert(a.end(), {"--strategy=fsdp-full", "--flavour=fsdp2", "--reduce-dtype=fp32",
                       "--fsdp2-groups=root"});
  } else if (wrapper == "fsdp1") {
    // FSDP1 under Composer's mixed precision modes (validation/measure_fsdp1_steps.py: torch's
    // BACKWARD_PRE), or as accelerate prepares it (measure_accelerate_steps.py: backward_prefetch
    // None, the hf recipe's own): the case's mode, none for fp32.
    a.insert(a.end(), {"--strategy=fsdp-full", "--flavour=fsdp1"});
    if (c.value("framework", std::string()) != "accelerate")
      a.emplace_back("--backward-prefetch=pre");
    if (c.contains("fsdp_mixed_precision") && !c.at("fsdp_mixed_precision").is_null())
      a.push_back("--fsdp-mixed-precision=" + text(c, "fsdp_mixed_precision"));
  } else {
    throw std::runtime_error("corpus case " + text(c, "id") + ": unknown wrapper " + wrapper);
  }
  return a;
}

namespace {

// gloo on a CPU runs each collective FSDP1 issues to its end inside the hook that issues it (no
// communication stream: the next unit's backward, and its prefetch, wait for it), so FSDP1's
// cases are predicted on the profile as a CPU rank, whose collectives block
// (HardwareProfile::collectives_block). (FSDP2's next group waits for the previous
// reduce-scatter on a GPU too: its cases keep the GPU's profile.)
nlohmann::json as_cpu_rank(nlohmann::json profile) {
  profile["gpu"]["kind"] = "cpu";
  return profile;
}

// The estimate a user gets for the case, as JSON.
nlohmann::json estimate(const nlohmann::json& corpus, const nlohmann::json& c) {
  planner::Request request;
  request.args = estimate_args(c);
  if (text(c, "wrapper") == "fsdp1") {
    std::erase(request.args, std::string("--hardware=a100-sxm4-80gb"));
    request.hardware = as_cpu_rank(read_corpus_file(std::string(SHARDPLAN_SOURCE_DIR) +
                                                    "/hardware_profiles/a100-sxm4-80gb.json"));
  }
  request.model = corpus.at("configs").at(text(c, "config"));
  if (c.contains("deepspeed_config")) request.deepspeed = c.at("deepspeed_config");
  return nlohmann::json::parse(planner::run_request(request).output);
}

}  // namespace

std::vector<Row> comm_rows(const nlohmann::json& corpus) {
  std::vector<Row> rows;
  for (const auto& c : corpus.at("cases")) {
    if (!c.contains("collectives")) continue;
    const auto e = estimate(corpus, c);
    const auto& predicted = e.at("comm").at("bytes_by_collective");
    const auto& measured = c.at("collectives");
    const std::string id = text(c, "id"), recipe = c.value("recipe", std::string("hf"));
    double predicted_total = 0, measured_total = 0;
    for (const auto& traits : documents::collective_table()) {
      const double p = predicted.value(traits.name, 0.0);
      const double m = measured.contains(traits.name)
                           ? measured.at(traits.name).at("bytes_sent").get<double>()
                           : 0.0;
      predicted_total += p;
      measured_total += m;
      if (p > 0 || m > 0)
        rows.push_back({id, recipe, fmt::format("bytes/{}", traits.name), p, m, ""});
    }
    rows.push_back({id, recipe, "bytes/total", predicted_total, measured_total, ""});
  }
  return rows;
}

std::vector<Row> step_rows(const nlohmann::json& corpus) {
  std::vector<Row> rows;
  const auto& configs = corpus.at("configs");
  for (const auto& c : corpus.at("cases")) {
    const auto e = estimate(corpus, c);
    const auto& memory = e.at("memory");
    const std::string id = text(c, "id"), recipe = c.value("recipe", std::string("hf"));
    const std::string skipped = cpu_only_reason(configs, c);
    Row peak{id,
             recipe,
             "peak",
             memory.at("allocated_peak_bytes").get<double>(),
             c.at("peak_bytes").get<double>(),
             skipped};
    if (c.contains("peak_bytes_range")) {
      peak.measured_low = c.at("peak_bytes_range").at(0).get<double>();
      peak.measured_high = c.at("peak_bytes_range").at(1).get<double>();
    }
    rows.push_back(peak);
    const Breakdown measured = measured_categories(c.at("at_peak"));
    // Categories describe one moment: where two moments have nearly the same total (the end of
    // the optimizer step and the loss's backward), they are compared only when both peaks fall
    // in the same phase.
    const std::string when = memory.at("peak_when").get<std::string>();
    const bool predicted_in_step = when.rfind("optimizer", 0) == 0;
    // measure_steps.py names the optimizer's phase "optimizer", measure_deepspeed.py "step".
    const std::string phase = c.value("peak_phase", std::string());
    const bool measured_in_step = phase == "optimizer" || phase == "step";
    const std::string other_moment =
        predicted_in_step == measured_in_step
            ? skipped
            : fmt::format("the peak falls in another phase: predicted {}, measured {}", when,
                          phase);
    for (int k = 0; k < documents::kCategories; ++k) {
      const auto category = static_cast<Category>(k);
      if (category == Category::overhead) continue;
      const std::string name = documents::category_name(category);
      rows.push_back({id, recipe, "peak/" + name, memory.at("breakdown").at(name).get<double>(),
                      measured[k], skipped.empty() ? other_moment : skipped});
    }
  }
  return rows;
}

}  // namespace shardplan::oracle
