#include "planner/recommend.hpp"

#include <cmath>

#include <fmt/format.h>

#include "costmodel/block_linears.hpp"
#include "documents/plan.hpp"
#include "planner/loss_requirement.hpp"
#include "planner/text.hpp"

namespace shardplan::planner {

using namespace costmodel;
using namespace documents;

namespace {

nlohmann::json candidate_json(const Scenario& sc, const Candidate& c) {
  auto j = evaluation_to_json(sc, c.eval);
  j.erase("schema_version");  // the recommendation document's own
  j["family"] = c.family;
  return j;
}

std::string knobs(const Evaluation& e) {
  std::string s = fmt::format("{} ({})", e.spec.strategy, flavour_name(e.spec.flavour));
  if (e.spec.shard_group_size > 0) s += fmt::format(" group {}", e.spec.shard_group_size);
  s += fmt::format(", mb {}x{}, ckpt {}, loss {}", e.job.micro_batch, e.result.grad_accumulation,
                   checkpointing_label(e.job), loss_label(e.job));
  if (e.spec.offload != Offload::none)
    s += fmt::format(", offload {}", offload_name(e.spec.offload));
  if (e.spec.shard_parameters) {
    s += fmt::format(", prefetch {}", e.spec.forward_prefetch);
    if (e.spec.backward_prefetch != e.spec.forward_prefetch)
      s += fmt::format(" (backward {})", e.spec.backward_prefetch);
  }
  if (const auto mp = fsdp_mixed_precision(e.spec, compute_dtype(e.job.precision)))
    s += fmt::format(", mixed precision {}", fsdp_mixed_precision_name(*mp));
  if (e.spec.reduce_bucket_bytes > 0)
    s += fmt::format(", bucket {:.0f} MiB", e.spec.reduce_bucket_bytes / 1048576.0);
  return s;
}

// The job with the recipe's Float8 (torchtitan's default recipe, rowwise) where it could add it
// as the recipe runs it (planner/scenario.cpp, apply_float8, refuses the rest), else nullopt.
std::optional<TrainingJob> with_float8(const Scenario& sc, const TrainingJob& j) {
  if (j.float8 != Float8Recipe::none || !recipe_traits(j.recipe).offers_float8 ||
      sc.hardware.fp8_peak_flops <= 0 || j.precision != Precision::bf16_mixed)
    return std::nullopt;
  TrainingJob f = j;
  f.float8 = Float8Recipe::rowwise;
  if (f.compile && !float8_whole_block(sc.model, f)) return std::nullopt;
  return f;
}

// "with Float8 rowwise (--float8 rowwise; torchao, its numerics): step 1.458 s instead of
// 2.364 s (38% less), peak 28.7 GiB instead of 28.7 GiB"
std::string float8_line(const Evaluation& bf16, const Evaluation& fp8) {
  const double step = fp8.result.step_s, was = bf16.result.step_s;
  return fmt::format("with Float8 {} (--float8 {}; torchao, which changes the numerics): step "
                     "{:.3f} s instead of {:.3f} s ({:.0f}% {}), peak {:.1f} GiB instead of "
                     "{:.1f} GiB",
                     float8_recipe_name(fp8.job.float8), float8_recipe_name(fp8.job.float8), step,
                     was, 100 * std::abs(was - step) / was, step <= was ? "less" : "more",
                     fp8.result.peak_bytes / kGiB, bf16.result.peak_bytes / kGiB);
}

}  // namespace

Recommendation recommend(const Scenario& sc, const SearchPins& pins) {
  Recommendation r;
  r.search = search(sc, pins);
  r.explanation = explain(sc, pins, r.search);
  if (!r.search.ranked.empty()) {
    const Evaluation& best = r.search.ranked.front().eval;
    if (const auto j = with_float8(sc, best.job))
      r.with_float8 = evaluate_layout(sc, best.spec, *j, best.layout);
  } else if (const auto j = with_float8(sc, sc.job)) {
    // Nothing fits in 16 bits: the same search with Float8, whose compiled block keeps less.
    Scenario f = sc;
    f.job = *j;
    const auto found = search(f, pins);
    if (!found.ranked.empty()) r.with_float8 = found.ranked.front().eval;
  }
  return r;
}

std::optional<Evaluation> layouts_with_float8(const Scenario& sc, const LayoutSearch& found) {
  if (!found.ranked.empty()) {
    const LayoutCandidate& best = found.ranked.front();
    const auto j = with_float8(sc, best.job);
    if (!j) return std::nullopt;
    return evaluate_layout(sc, best.spec, *j, best.layout);
  }
  // Nothing fits in 16 bits: the same search with Float8, whose blocks keep less.
  const auto j = with_float8(sc, sc.job);
  if (!j) return std::nullopt;
  Scenario f = sc;
  f.job = *j;
  const auto with = search_layouts(f, 1);
  if (with.ranked.empty()) return std::nullopt;
  const LayoutCandidate& c = with.ranked.front();
  return layout_evaluation(f, c.spec, c.job, c.layout, c.result);
}

std::string layout_float8_line(const Scenario& sc, const LayoutSearch& found,
                               const Evaluation& fp8) {
  const auto& l = fp8.layout;
  const std::string plan = fmt::format(
      "tp {}{}, pp {}, cp {}, dp {}, {} ({}), mb {}, ckpt {}", l.tensor_parallel,
      l.sequence_parallel ? " sp" : "", l.pipeline_parallel, l.context_parallel,
      l.data_parallel(sc.cluster.gpus), fp8.spec.strategy, flavour_name(fp8.spec.flavour),
      fp8.job.micro_batch, checkpointing_label(fp8.job));
  const char* name = float8_recipe_name(fp8.job.float8);
  if (found.ranked.empty())
    return fmt::format("with Float8 {} (--float8 {}; torchao, which changes the numerics) one "
                       "layout does: {}, step {:.3f} s, peak {:.1f} GiB of {:.1f} GiB usable",
                       name, name, plan, fp8.result.step_s, fp8.result.peak_bytes / kGiB,
                       sc.usable_bytes() / kGiB);
  const auto& best = found.ranked.front().result.step;
  return fmt::format("with Float8 {} (--float8 {}; torchao, which changes the numerics) the "
                     "fastest layout ({}): step {:.3f} s instead of {:.3f} s, peak {:.1f} GiB "
                     "instead of {:.1f} GiB{}",
                     name, name, plan, fp8.result.step_s, best.step_s, fp8.result.peak_bytes / kGiB,
                     best.peak_bytes / kGiB, fp8.fits ? "" : " (does not fit)");
}

std::string default_job_line(const Scenario& sc) {
  return fmt::format(
      "no model or hardware given: planning the built-in default job ({} on {} x {}, seq {}, "
      "global batch {}); see --help to plan yours",
      sc.model.name, sc.cluster.gpus, sc.hardware.name, sc.job.seq_len, sc.job.global_batch);
}

std::string recommendation_table(const Scenario& sc, const Recommendation& r, int top) {
  Text t;
  const auto& s = r.search;
  // What the recommended plan asks of the training code, before anything else.
  if (!s.ranked.empty())
    for (const auto& needs :
         plan_requirements(s.ranked.front().eval.spec, s.ranked.front().eval.job))
      t.line("NOTE: {}", needs);
  if (sc.is_default)
    t.line("{}", default_job_line(sc));
  else if (!sc.defaulted.empty())
    t.line("{}", defaults_line(sc));
  t.line("{}", scenario_line(sc));
  t.line("{}", hardware_line(sc));
  t.line("searched {} plans ({} simulated) in {:.3f} s", s.plans_considered, s.plans_simulated,
         s.seconds);
  t.line("");
  if (s.ranked.empty()) {
    t.line("NO PLAN FITS (the reasons follow)");
    if (r.with_float8)
      t.line("with Float8 {} (--float8 {}; torchao, which changes the numerics) one does: {}, "
             "step {:.3f} s, peak {:.1f} GiB of {:.1f} GiB usable",
             float8_recipe_name(r.with_float8->job.float8),
             float8_recipe_name(r.with_float8->job.float8), knobs(*r.with_float8),
             r.with_float8->result.step_s, r.with_float8->result.peak_bytes / kGiB,
             sc.usable_bytes() / kGiB);
  } else {
    t.line("RECOMMENDED  {}", knobs(s.ranked.front().eval));
    t.str += evaluation_table(sc, s.ranked.front().eval);
    if (r.with_float8) t.line("{}", float8_line(s.ranked.front().eval, *r.with_float8));
  }
  t.line("");
  t.line("bottleneck: {}", render(r.explanation.summary));
  for (const auto& reason : r.explanation.reasons) t.line("  - {}", render(reason));
  t.line("");
  t.line("best plan of each family");
  t.line("  {:<12} {:>6} {:>10} {:>10} {:>10} {:>7}  {}", "family", "fits", "peak GiB", "step s",
         "tokens/s", "MFU", "settings");
  for (const auto& c : s.best_per_family) {
    const auto& e = c.eval;
    t.line("  {:<12} {:>6} {:>10.1f} {:>10.3f} {:>10.0f} {:>6.1f}%  {}", c.family,
           e.fits ? "yes" : "no", e.result.peak_bytes / kGiB, e.result.step_s,
           e.result.tokens_per_s, 100 * e.result.mfu, knobs(e));
  }
  if (!s.rejected.empty()) {
    t.line("");
    t.line("families that do not fit");
    for (const auto& [family, reason] : s.rejected) t.line("  {}: {}", family, reason);
  }
  if (!s.pareto.empty()) {
    t.line("");
    t.line("Pareto front (peak memory vs step time)");
    for (const auto& c : s.pareto)
      t.line("  {:>8.1f} GiB  {:>8.3f} s  {}", c.eval.result.peak_bytes / kGiB,
             c.eval.result.step_s, knobs(c.eval));
  }
  if (top > 0 && s.ranked.size() > 1) {
    t.line("");
    t.line("top {} of {} fitting plans",
           std::min<std::size_t>(static_cast<std::size_t>(top), s.ranked.size()), s.ranked.size());
    for (std::size_t i = 0; i < s.ranked.size() && i < static_cast<std::size_t>(top); ++i) {
      const auto& e = s.ranked[i].eval;
      t.line("  {:>3}. {:>8.3f} s {:>8.1f} GiB  {}", i + 1, e.result.step_s,
             e.result.peak_bytes / kGiB, knobs(e));
    }
  }
  return t.str;
}

nlohmann::json recommendation_json(const Scenario& sc, const Recommendation& r, int top) {
  const auto& s = r.search;
  nlohmann::json out;
  out["schema_version"] = kEstimateSchemaVersion;  // its candidates are estimate's documents
  out["default_job"] = sc.is_default;
  out["scenario"] = scenario_line(sc);
  out["hardware_profile"] = hardware_json(sc);
  if (!sc.defaulted.empty()) out["defaulted"] = sc.defaulted;
  out["recommendation"] =
      s.ranked.empty() ? nlohmann::json(nullptr) : candidate_json(sc, s.ranked.front());
  if (r.with_float8) {
    auto f = evaluation_to_json(sc, *r.with_float8);
    f.erase("schema_version");
    out["with_float8"] = f;
  }
  if (!s.ranked.empty())
    if (const auto needs = plan_requirements(s.ranked.front().eval.spec, s.ranked.front().eval.job);
        !needs.empty())
      out["requires"] = needs;
  nlohmann::json candidates = nlohmann::json::array();
  for (std::size_t i = 0; i < s.ranked.size() && i < static_cast<std::size_t>(top); ++i)
    candidates.push_back(candidate_json(sc, s.ranked[i]));
  for (const auto& c : s.best_per_family)
    if (!c.eval.fits) candidates.push_back(candidate_json(sc, c));
  out["candidates"] = candidates;
  out["fastest_ignoring_memory"] = s.fastest_ignoring_memory
                                       ? candidate_json(sc, *s.fastest_ignoring_memory)
                                       : nlohmann::json(nullptr);
  nlohmann::json families = nlohmann::json::array();
  for (const auto& c : s.best_per_family) families.push_back(candidate_json(sc, c));
  out["best_per_family"] = families;
  nlohmann::json pareto = nlohmann::json::array();
  for (const auto& c : s.pareto) pareto.push_back(candidate_json(sc, c));
  out["pareto"] = pareto;
  nlohmann::json rejected = nlohmann::json::array();
  for (const auto& [family, reason] : s.rejected)
    rejected.push_back({{"family", family}, {"reason", reason}});
  out["rejected"] = rejected;
  nlohmann::json reasons = nlohmann::json::array();
  for (const auto& reason : r.explanation.reasons) reasons.push_back(claim_json(reason));
  out["bottleneck"] = {{"name", bottleneck_name(r.explanation.bottleneck)},
                       {"summary", claim_json(r.explanation.summary)},
                       {"reasons", reasons}};
  out["search"] = {{"plans_evaluated", s.plans_simulated},
                   {"plans_considered", s.plans_considered},
                   {"fitting", s.ranked.size()},
                   {"seconds", s.seconds}};
  return out;
}

nlohmann::json plan_document(const Scenario& sc, const Evaluation& e) {
  Plan p;
  p.model = sc.model;
  p.hardware = sc.hardware.name;
  p.cluster = sc.cluster;
  // --gpu-memory-GiB: the size the plan was made to fit travels with it to the executor.
  if (sc.profile_memory_bytes)
    p.gpu_memory_GiB = sc.hardware.memory_bytes / (1024.0 * 1024.0 * 1024.0);
  p.job = e.job;
  p.spec = e.spec;
  p.prediction = prediction_from(e.result);
  return plan_to_json(p);
}

}  // namespace shardplan::planner
