#include "planner/parallel_search.hpp"

#include <algorithm>
#include <chrono>
#include <limits>

#include <fmt/format.h>

#include "documents/recipe.hpp"
#include "planner/emit_parallel.hpp"
#include "planner/estimate.hpp"

namespace shardplan::planner {

using namespace costmodel;
using namespace documents;

namespace {

std::vector<int> divisors(std::int64_t n, std::int64_t at_most) {
  std::vector<int> out;
  for (std::int64_t d = 1; d <= std::min(n, at_most); ++d)
    if (n % d == 0) out.push_back(static_cast<int>(d));
  return out;
}

bool faster(const LayoutCandidate& a, const LayoutCandidate& b) {
  if (a.result.step.step_s != b.result.step.step_s)
    return a.result.step.step_s < b.result.step.step_s;
  return a.result.step.peak_bytes < b.result.step.peak_bytes;
}

// The activation checkpointing modes tried, least recompute first: the job's when
// --checkpointing named one; otherwise none, Megatron's selective recompute of the attention core
// where attention is eager (with flash attention the core saves nothing more than its output: the
// same as none), torchtitan's op-level save list where the recipe offers it, and full.
std::vector<TrainingJob> checkpointing_jobs(const Scenario& sc) {
  if (sc.checkpointing_named) return {sc.job};
  std::vector<TrainingJob> out;
  auto add = [&](Checkpointing mode) {
    TrainingJob j = sc.job;
    j.checkpointing = mode;
    j.checkpoint_every = 0;
    out.push_back(j);
  };
  add(Checkpointing::none);
  const RecipeTraits& r = recipe_traits(sc.job.recipe);
  if (sc.job.attention == AttentionImpl::eager && r.offers_selective_attention)
    add(Checkpointing::selective_attention);
  if (r.offers_selective_op) add(Checkpointing::selective_op);
  add(Checkpointing::full);
  return out;
}

struct Walker {
  const Scenario& sc;
  LayoutSearch& out;
  std::vector<ShardingSpec> specs;
  std::vector<TrainingJob> jobs;  // one per checkpointing mode, least recompute first
  std::vector<double> fastest;    // the keep fastest fitting steps so far, ascending
  std::function<bool(const LayoutCandidate&)> counts;  // which plans count (empty: all)

  // A step a plan must beat to rank among the `keep` fastest.
  double to_beat() const {
    return out.keep > 0 && fastest.size() == static_cast<std::size_t>(out.keep)
               ? fastest.back()
               : std::numeric_limits<double>::infinity();
  }
  void ranked(LayoutCandidate c) {
    if (out.keep > 0 && (!counts || counts(c))) {
      fastest.insert(std::upper_bound(fastest.begin(), fastest.end(), c.result.step.step_s),
                     c.result.step.step_s);
      if (fastest.size() > static_cast<std::size_t>(out.keep)) fastest.pop_back();
    }
    out.ranked.push_back(std::move(c));
  }

  // Every micro-batch of one layout, strategy and checkpointing mode above `above`, smallest
  // first, until one does not fit; returns the largest that fits (`above` when none does).
  // Recompute at a micro-batch that fits without it only adds compute: a mode with more recompute
  // starts above the micro-batches the previous modes fit.
  std::int64_t micro_batches(ParallelLayout l, const ShardingSpec& spec, const TrainingJob& job,
                             std::int64_t per_replica, std::int64_t above) {
    ++out.layouts;
    for (int mb : divisors(per_replica, per_replica)) {
      if (mb <= above) continue;
      // A micro-batch the job names (--micro-batch, or the job's) is the only one tried.
      if (sc.job.micro_batch > 0 && mb != sc.job.micro_batch) continue;
      l.micro_batches = static_cast<int>(per_replica / mb);
      if (l.schedule == PipelineSchedule::interleaved_1f1b &&
          l.micro_batches % l.pipeline_parallel != 0)
        continue;
      LayoutCandidate c{l, spec, job, {}, false};
      c.job.micro_batch = mb;
      if (!l.trivial() && !layout_problems(l, sc.model, c.job, sc.cluster).empty())
        return above;  // not by the batch
      const StepInput in = step_input(sc, spec, c.job);
      // (No bound to compute until `keep` plans are there to beat.)
      if (const double beat = to_beat(); l.pipeline_parallel > 1 &&
                                         beat < std::numeric_limits<double>::infinity() &&
                                         parallel_step_bound(in, l) > beat) {
        ++out.outranked;  // its fit unknown: the next micro-batch is tried
        continue;
      }
      ++out.evaluated;
      c.result = simulate_parallel_step(in, l);
      c.fits = c.result.step.valid && c.result.step.peak_bytes <= sc.usable_bytes();
      if (l.trivial()) {
        auto& best = out.best_data_parallel;
        const bool better_dp =
            !best || (c.fits && (!best->fits || faster(c, *best))) ||
            (!c.fits && !best->fits && c.result.step.peak_bytes < best->result.step.peak_bytes);
        if (c.result.step.valid && better_dp) best = c;
      }
      if (!c.fits) return above;
      above = mb;
      ranked(std::move(c));
    }
    return above;
  }

  void strategies(const ParallelLayout& l, std::int64_t per_replica) {
    for (const auto& spec : specs) {
      std::int64_t fitted = 0;
      for (const auto& job : jobs) fitted = micro_batches(l, spec, job, per_replica, fitted);
      // Megatron-LM's --overlap-grad-reduce beside its default reduction after the backward,
      // its buckets sized for the layout's data- and context-parallel ranks.
      if (!spec.main_grad_buffer || spec.reduce_bucket_bytes > 0) continue;
      const ShardingSpec overlapped =
          with_overlap_grad_reduce(spec, l.data_parallel(sc.cluster.gpus) * l.context_parallel);
      fitted = 0;
      for (const auto& job : jobs) fitted = micro_batches(l, overlapped, job, per_replica, fitted);
    }
  }

  void layouts() {
    const int G = sc.cluster.gpus_per_node, N = sc.cluster.gpus;
    const auto L = sc.model.layers;
    const RecipeTraits& recipe = recipe_traits(sc.job.recipe);
    // The stage counts that split the blocks evenly, and where the recipe counts the embeddings
    // and the head as blocks by default (torchtitan), those that split them evenly so; only the
    // dimensions the recipe's trainer runs.
    std::vector<int> stages = recipe.schedules.empty() ? std::vector<int>{1} : divisors(L, L);
    const int less = recipe.pipeline_less_layers;
    if (less > 0 && !recipe.schedules.empty())
      for (int p : divisors(L + 2 * static_cast<std::int64_t>(less), L))
        if (std::find(stages.begin(), stages.end(), p) == stages.end()) stages.push_back(p);
    const int max_t = recipe.offers_tensor_parallel ? G : 1;
    const int max_c = recipe.offers_context_parallel ? 64 : 1;
    for (int t : divisors(max_t, max_t))
      for (int p : stages) {
        if (N % (t * p) != 0) continue;
        for (int c = 1; c <= max_c && N % (t * p * c) == 0; c *= 2) {
          const int d = N / (t * p * c);
          if (sc.job.global_batch % d != 0) continue;
          for (const auto& [schedule, v] : pipeline_variants(p, L, recipe)) {
            ParallelLayout l;
            l.tensor_parallel = t;
            l.sequence_parallel = t > 1 && recipe.offers_sequence_parallel;
            l.pipeline_parallel = p;
            l.schedule = schedule;
            l.virtual_stages = v;
            l.context_parallel = c;
            documents::apply_recipe_split(l, sc.job.recipe);
            strategies(l, sc.job.global_batch / d);
          }
        }
      }
  }
};

}  // namespace

// The pipeline variants of p stages: one stage has no schedule; more run 1F1B, and interleaved
// with 2..8 chunks where the chunks divide a stage's blocks and the recipe's pipeline has it
// (RecipeTraits::schedules).
std::vector<std::pair<PipelineSchedule, int>> pipeline_variants(int p, std::int64_t layers,
                                                                const documents::RecipeTraits& r) {
  std::vector<std::pair<PipelineSchedule, int>> out = {{PipelineSchedule::one_f_one_b, 1}};
  if (p == 1 || std::find(r.schedules.begin(), r.schedules.end(),
                          PipelineSchedule::interleaved_1f1b) == r.schedules.end())
    return out;
  for (int v : divisors(layers / p, 8))
    if (v >= 2) out.emplace_back(PipelineSchedule::interleaved_1f1b, v);
  return out;
}

LayoutSearch search_layouts(const Scenario& sc, int keep,
                            const std::function<bool(const LayoutCandidate&)>& counts) {
  const auto start = std::chrono::steady_clock::now();
  LayoutSearch out;
  out.keep = std::max(0, keep);
  const int G = sc.cluster.gpus_per_node;
  Walker w{sc, out, {}, checkpointing_jobs(sc), {}, counts};
  // Each strategy under the engine the recipe runs it with (Megatron's own DDP and distributed
  // optimizer for its recipe).
  const auto& recipe = recipe_traits(sc.job.recipe);
  for (const char* strategy : {"ddp", "zero1"})
    w.specs.push_back(
        with_job_precision(make_spec(strategy, recipe.flavour_for(strategy), G), sc.job));
  w.specs.push_back(with_job_precision(make_spec("fsdp-full", Flavour::fsdp2, G), sc.job));
  w.layouts();
  std::stable_sort(out.ranked.begin(), out.ranked.end(), faster);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

FsdpLimits fsdp_limits(const Scenario& sc, const LayoutSearch& s) {
  FsdpLimits f;
  const auto n = sc.cluster.gpus;
  f.sequences_per_gpu = static_cast<double>(sc.job.global_batch) / n;
  f.batch_divides = sc.job.global_batch % n == 0;
  if (f.batch_divides) {
    TrainingJob j = sc.job;
    j.micro_batch = 1;
    j.checkpointing = Checkpointing::none;
    const auto spec = with_job_precision(
        make_spec("fsdp-full", Flavour::fsdp2, sc.cluster.gpus_per_node), sc.job);
    const auto r = simulate_parallel_step(step_input(sc, spec, j), ParallelLayout{}).step;
    if (r.valid) {
      f.no_recompute_peak_bytes = r.peak_bytes;
      f.no_recompute_activation_bytes = r.at_peak[static_cast<int>(Category::activations)];
    }
  }
  if (s.best_data_parallel && s.best_data_parallel->fits) {
    f.best_exposed_s = s.best_data_parallel->result.step.exposed_comm_s;
    f.best_step_s = s.best_data_parallel->result.step.step_s;
  }
  return f;
}

}  // namespace shardplan::planner

namespace shardplan::planner {

using namespace costmodel;
using namespace documents;

namespace {

std::string layout_cell(const LayoutCandidate& c, int gpus) {
  const auto& l = c.layout;
  std::string pp = fmt::format("{}", l.pipeline_parallel);
  if (l.pipeline_parallel > 1)
    pp += l.virtual_stages > 1 ? fmt::format(" int.x{}", l.virtual_stages) : std::string(" 1f1b");
  return fmt::format("{:>3} {:>3} {:>11} {:>3} {:>5} {:>4} {:>4}", l.tensor_parallel,
                     l.sequence_parallel ? "yes" : "no", pp, l.context_parallel,
                     l.data_parallel(gpus), l.micro_batches, c.job.micro_batch);
}

std::string limits_line(const Scenario& sc, const FsdpLimits& f) {
  std::string out =
      fmt::format("where FSDP alone stops: batch limit {:g} sequences per GPU ({} over "
                  "{} GPUs{})",
                  f.sequences_per_gpu, sc.job.global_batch, sc.cluster.gpus,
                  f.batch_divides ? "" : ", not dividing");
  if (f.no_recompute_peak_bytes > 0)
    out += fmt::format("; activation wall: micro-batch 1 without recompute peaks at {} of {} "
                       "usable, {} of it activations",
                       gib(f.no_recompute_peak_bytes), gib(sc.usable_bytes()),
                       gib(f.no_recompute_activation_bytes));
  if (f.best_step_s > 0)
    out += fmt::format("; exposed communication {} of its best plan's {} step ({:.1f}%)",
                       seconds(f.best_exposed_s), seconds(f.best_step_s),
                       100 * f.best_exposed_s / f.best_step_s);
  return out + "\n";
}

// The recipe's own framework's options for a layout ("" for another recipe's plan: those
// options would run that framework's code, not the code the plan counts).
std::string recipe_torchtitan_options(const Scenario& sc, const LayoutCandidate& c) {
  return std::string_view(recipe_traits(sc.job.recipe).layout_emit) == "torchtitan"
             ? torchtitan_options(sc, c)
             : "";
}
std::string recipe_megatron_arguments(const Scenario& sc, const LayoutCandidate& c) {
  return std::string_view(recipe_traits(sc.job.recipe).layout_emit) == "megatron"
             ? megatron_arguments(sc, c)
             : "";
}

}  // namespace

std::string layout_search_table(const Scenario& sc, const LayoutSearch& s, int top) {
  std::string out = fmt::format("{} layouts x strategies considered, {} evaluated, {:.3f} s\n",
                                s.layouts, s.evaluated, s.seconds);
  if (s.outranked > 0)
    out += fmt::format(
        "{} pipelined candidates not walked: a bound on their step is above {}, "
        "the slowest of the {} fastest plans\n",
        s.outranked, seconds(s.ranked.at(static_cast<std::size_t>(s.keep) - 1).result.step.step_s),
        s.keep);
  if (s.best_data_parallel) {
    const auto& b = *s.best_data_parallel;
    out +=
        fmt::format("data parallelism alone: best {} with micro-batch {}, checkpointing {}: {} per "
                    "step, peak {}{}\n",
                    b.spec.strategy, b.job.micro_batch, checkpointing_label(b.job),
                    seconds(b.result.step.step_s), gib(b.result.step.peak_bytes),
                    b.fits ? "" : fmt::format(" (does not fit {} usable)", gib(sc.usable_bytes())));
  } else if (sc.job.global_batch % sc.cluster.gpus != 0) {
    out += fmt::format(
        "data parallelism alone: the global batch of {} sequences does not divide over {} GPUs\n",
        sc.job.global_batch, sc.cluster.gpus);
  }
  out += limits_line(sc, fsdp_limits(sc, s));
  if (s.ranked.empty()) return out + "no layout fits\n";
  out += fmt::format(
      "{:>4} {:>3} {:>3} {:>11} {:>3} {:>5} {:>4} {:>4} {:>10} {:>19} {:>11} {:>10} {:>10} "
      "{:>6}\n",
      "rank", "tp", "sp", "pp", "cp", "dp", "m", "mb", "strategy", "checkpointing", "step", "peak",
      "bubble", "MFU");
  for (int i = 0; i < top && i < static_cast<int>(s.ranked.size()); ++i) {
    const auto& c = s.ranked[static_cast<std::size_t>(i)];
    out +=
        fmt::format("{:>4} {} {:>10} {:>19} {:>11} {:>10} {:>10} {:>5.1f}%\n", i + 1,
                    layout_cell(c, sc.cluster.gpus), c.spec.strategy, checkpointing_label(c.job),
                    seconds(c.result.step.step_s), gib(c.result.step.peak_bytes),
                    seconds(c.layout.trivial() ? 0.0 : c.result.bubble_s), 100 * c.result.step.mfu);
  }
  const auto& best = s.ranked.front();
  if (const auto t = recipe_torchtitan_options(sc, best); !t.empty())
    out += "torchtitan: " + t + "\n";
  if (const auto m = recipe_megatron_arguments(sc, best); !m.empty())
    out += "Megatron-LM: " + m + "\n";
  return out;
}

nlohmann::json layout_search_json(const Scenario& sc, const LayoutSearch& s, int top) {
  // Each candidate is the document estimate prints for its layout, with the flags that run it.
  auto one = [&](const LayoutCandidate& c) {
    auto j = evaluation_to_json(sc, layout_evaluation(sc, c.spec, c.job, c.layout, c.result));
    j.erase("schema_version");  // the search document's own
    j["torchtitan"] = recipe_torchtitan_options(sc, c);
    j["megatron"] = recipe_megatron_arguments(sc, c);
    return j;
  };
  nlohmann::json ranked = nlohmann::json::array();
  for (int i = 0; i < top && i < static_cast<int>(s.ranked.size()); ++i)
    ranked.push_back(one(s.ranked[static_cast<std::size_t>(i)]));
  nlohmann::json j = {{"schema_version", kEstimateSchemaVersion},
                      {"layouts_considered", s.layouts},
                      {"evaluated", s.evaluated},
                      {"outranked", s.outranked},
                      {"search_s", s.seconds},
                      {"ranked", ranked}};
  j["best_data_parallel"] =
      s.best_data_parallel ? one(*s.best_data_parallel) : nlohmann::json(nullptr);
  const auto f = fsdp_limits(sc, s);
  j["fsdp_limits"] = {{"sequences_per_gpu", f.sequences_per_gpu},
                      {"batch_divides", f.batch_divides},
                      {"no_recompute_peak_bytes", f.no_recompute_peak_bytes},
                      {"no_recompute_activation_bytes", f.no_recompute_activation_bytes},
                      {"best_exposed_comm_s", f.best_exposed_s},
                      {"best_step_s", f.best_step_s}};
  return j;
}

}  // namespace shardplan::planner
