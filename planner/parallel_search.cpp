#include "planner/parallel_search.hpp"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "planner/estimate.hpp"

namespace shardplan::planner {

using namespace costmodel;

namespace {

std::vector<int> divisors(std::int64_t n, std::int64_t at_most) {
  std::vector<int> out;
  for (std::int64_t d = 1; d <= std::min(n, at_most); ++d)
    if (n % d == 0) out.push_back(static_cast<int>(d));
  return out;
}

// The pipeline variants of p stages: one stage has no schedule; more run 1F1B, and interleaved
// with 2..8 chunks where the chunks divide a stage's blocks.
std::vector<std::pair<PipelineSchedule, int>> schedules(int p, std::int64_t layers) {
  std::vector<std::pair<PipelineSchedule, int>> out = {{PipelineSchedule::one_f_one_b, 1}};
  if (p == 1) return out;
  for (int v : divisors(layers / p, 8))
    if (v >= 2) out.emplace_back(PipelineSchedule::interleaved_1f1b, v);
  return out;
}

bool faster(const LayoutCandidate& a, const LayoutCandidate& b) {
  if (a.result.step.step_s != b.result.step.step_s)
    return a.result.step.step_s < b.result.step.step_s;
  return a.result.step.peak_bytes < b.result.step.peak_bytes;
}

struct Walker {
  const Scenario& sc;
  LayoutSearch& out;
  std::vector<ShardingSpec> specs;

  // Every micro-batch of one layout and strategy, smallest first, until one does not fit.
  void micro_batches(ParallelLayout l, const ShardingSpec& spec, std::int64_t per_replica) {
    ++out.layouts;
    for (int mb : divisors(per_replica, per_replica)) {
      l.micro_batches = static_cast<int>(per_replica / mb);
      if (l.schedule == PipelineSchedule::interleaved_1f1b &&
          l.micro_batches % l.pipeline_parallel != 0)
        continue;
      LayoutCandidate c{l, spec, sc.job, {}, false};
      c.job.micro_batch = mb;
      if (!l.trivial() && !layout_problems(l, sc.model, c.job, sc.cluster).empty())
        return;  // not by the batch
      ++out.evaluated;
      c.result = simulate_parallel_step(step_input(sc, spec, c.job), l);
      c.fits = c.result.step.valid && c.result.step.peak_bytes <= sc.usable_bytes();
      if (l.trivial()) {
        auto& best = out.best_data_parallel;
        const bool better_dp =
            !best || (c.fits && (!best->fits || faster(c, *best))) ||
            (!c.fits && !best->fits && c.result.step.peak_bytes < best->result.step.peak_bytes);
        if (c.result.step.valid && better_dp) best = c;
      }
      if (!c.fits) return;
      out.ranked.push_back(std::move(c));
    }
  }

  void layouts() {
    const int G = sc.cluster.gpus_per_node, N = sc.cluster.gpus;
    const auto L = sc.model.layers;
    for (int t : divisors(G, G))
      for (int p : divisors(L, L)) {
        if (N % (t * p) != 0) continue;
        for (int c = 1; c <= 64 && N % (t * p * c) == 0; c *= 2) {
          const int d = N / (t * p * c);
          if (sc.job.global_batch % d != 0) continue;
          for (const auto& [schedule, v] : schedules(p, L)) {
            ParallelLayout l;
            l.tensor_parallel = t;
            l.sequence_parallel = t > 1;
            l.pipeline_parallel = p;
            l.schedule = schedule;
            l.virtual_stages = v;
            l.context_parallel = c;
            for (const auto& spec : specs) micro_batches(l, spec, sc.job.global_batch / d);
          }
        }
      }
  }
};

}  // namespace

LayoutSearch search_layouts(const Scenario& sc) {
  const auto start = std::chrono::steady_clock::now();
  LayoutSearch out;
  const int G = sc.cluster.gpus_per_node;
  Walker w{sc, out, {}};
  w.specs = {with_job_precision(make_spec("ddp", std::nullopt, G), sc.job),
             with_job_precision(make_spec("zero1", std::nullopt, G), sc.job),
             with_job_precision(make_spec("fsdp-full", Flavour::fsdp2, G), sc.job)};
  w.layouts();
  std::stable_sort(out.ranked.begin(), out.ranked.end(), faster);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

}  // namespace shardplan::planner

namespace shardplan::planner {

using namespace costmodel;

namespace {

int layers_per_chunk(const Scenario& sc, const ParallelLayout& l) {
  return static_cast<int>(sc.model.layers /
                          (static_cast<std::int64_t>(l.pipeline_parallel) * l.virtual_stages));
}

const char* titan_schedule(PipelineSchedule s) {
  switch (s) {
  case PipelineSchedule::one_f_one_b:
    return "1F1B";
  case PipelineSchedule::interleaved_1f1b:
    return "Interleaved1F1B";
  case PipelineSchedule::gpipe:
    return "GPipe";
  }
  return "?";
}

std::string layout_cell(const LayoutCandidate& c, int gpus) {
  const auto& l = c.layout;
  std::string pp = fmt::format("{}", l.pipeline_parallel);
  if (l.pipeline_parallel > 1)
    pp += l.virtual_stages > 1 ? fmt::format(" int.x{}", l.virtual_stages) : std::string(" 1f1b");
  return fmt::format("{:>3} {:>3} {:>11} {:>3} {:>5} {:>4} {:>4}", l.tensor_parallel,
                     l.sequence_parallel ? "yes" : "no", pp, l.context_parallel,
                     l.data_parallel(gpus), l.micro_batches, c.job.micro_batch);
}

}  // namespace

std::string torchtitan_options(const Scenario& sc, const LayoutCandidate& c) {
  const auto& l = c.layout;
  const int d = l.data_parallel(sc.cluster.gpus);
  if (c.spec.flavour != Flavour::ddp && c.spec.flavour != Flavour::fsdp2) return "";
  const bool shard = c.spec.shard_parameters;
  std::string s = fmt::format(
      "--parallelism.data_parallel_replicate_degree {} --parallelism.data_parallel_shard_degree {} "
      "--parallelism.tensor_parallel_degree {}",
      shard ? 1 : d, shard ? d : 1, l.tensor_parallel);
  if (l.async_tensor_parallel) s += " --parallelism.enable_async_tensor_parallel";
  if (l.pipeline_parallel > 1)
    s += fmt::format(
        " --parallelism.pipeline_parallel_degree {} --parallelism.pipeline_parallel_schedule {} "
        "--parallelism.pipeline_parallel_layers_per_stage {} "
        "--parallelism.pipeline_parallel_microbatch_size {}",
        l.pipeline_parallel, titan_schedule(l.schedule), layers_per_chunk(sc, l),
        c.job.micro_batch);
  s += fmt::format(" --parallelism.context_parallel_degree {}", l.context_parallel);
  return s;
}

std::string megatron_arguments(const Scenario& sc, const LayoutCandidate& c) {
  const auto& l = c.layout;
  if (c.spec.shard_parameters) return "";
  std::string s = fmt::format("--tensor-model-parallel-size {}", l.tensor_parallel);
  if (l.sequence_parallel) s += " --sequence-parallel";
  if (l.async_tensor_parallel) s += " --tp-comm-overlap";
  s += fmt::format(" --pipeline-model-parallel-size {}", l.pipeline_parallel);
  if (l.virtual_stages > 1)
    s += fmt::format(" --num-layers-per-virtual-pipeline-stage {}", layers_per_chunk(sc, l));
  s += fmt::format(" --context-parallel-size {} --micro-batch-size {} --global-batch-size {}",
                   l.context_parallel, c.job.micro_batch, sc.job.global_batch);
  if (c.spec.shard_optimizer) s += " --use-distributed-optimizer";
  return s;
}

std::string layout_search_table(const Scenario& sc, const LayoutSearch& s, int top) {
  std::string out = fmt::format("{} layouts x strategies considered, {} evaluated, {:.3f} s\n",
                                s.layouts, s.evaluated, s.seconds);
  if (s.best_data_parallel) {
    const auto& b = *s.best_data_parallel;
    out +=
        fmt::format("data parallelism alone: best {} with micro-batch {}: {} per step, peak {}{}\n",
                    b.spec.strategy, b.job.micro_batch, seconds(b.result.step.step_s),
                    gib(b.result.step.peak_bytes),
                    b.fits ? "" : fmt::format(" (does not fit {} usable)", gib(sc.usable_bytes())));
  } else if (sc.job.global_batch % sc.cluster.gpus != 0) {
    out += fmt::format(
        "data parallelism alone: the global batch of {} sequences does not divide over {} GPUs\n",
        sc.job.global_batch, sc.cluster.gpus);
  }
  if (s.ranked.empty()) return out + "no layout fits\n";
  out += fmt::format(
      "{:>4} {:>3} {:>3} {:>11} {:>3} {:>5} {:>4} {:>4} {:>10} {:>11} {:>10} {:>10} {:>6}\n",
      "rank", "tp", "sp", "pp", "cp", "dp", "m", "mb", "strategy", "step", "peak", "bubble", "MFU");
  for (int i = 0; i < top && i < static_cast<int>(s.ranked.size()); ++i) {
    const auto& c = s.ranked[static_cast<std::size_t>(i)];
    out += fmt::format(
        "{:>4} {} {:>10} {:>11} {:>10} {:>10} {:>5.1f}%\n", i + 1, layout_cell(c, sc.cluster.gpus),
        c.spec.strategy, seconds(c.result.step.step_s), gib(c.result.step.peak_bytes),
        seconds(c.layout.trivial() ? 0.0 : c.result.bubble_s), 100 * c.result.step.mfu);
  }
  const auto& best = s.ranked.front();
  if (const auto t = torchtitan_options(sc, best); !t.empty()) out += "torchtitan: " + t + "\n";
  if (const auto m = megatron_arguments(sc, best); !m.empty()) out += "Megatron-LM: " + m + "\n";
  return out;
}

nlohmann::json layout_search_json(const Scenario& sc, const LayoutSearch& s, int top) {
  auto one = [&](const LayoutCandidate& c) {
    return nlohmann::json{{"parallelism", layout_to_json(c.layout)},
                          {"data_parallel", c.layout.data_parallel(sc.cluster.gpus)},
                          {"strategy", c.spec.strategy},
                          {"micro_batch", c.job.micro_batch},
                          {"step_s", c.result.step.step_s},
                          {"peak_bytes", c.result.step.peak_bytes},
                          {"peak_when", c.result.step.peak_when},
                          {"bubble_s", c.result.bubble_s},
                          {"mfu", c.result.step.mfu},
                          {"fits", c.fits},
                          {"torchtitan", torchtitan_options(sc, c)},
                          {"megatron", megatron_arguments(sc, c)}};
  };
  nlohmann::json ranked = nlohmann::json::array();
  for (int i = 0; i < top && i < static_cast<int>(s.ranked.size()); ++i)
    ranked.push_back(one(s.ranked[static_cast<std::size_t>(i)]));
  nlohmann::json j = {{"schema_version", 1},
                      {"layouts_considered", s.layouts},
                      {"evaluated", s.evaluated},
                      {"search_s", s.seconds},
                      {"ranked", ranked}};
  j["best_data_parallel"] =
      s.best_data_parallel ? one(*s.best_data_parallel) : nlohmann::json(nullptr);
  return j;
}

}  // namespace shardplan::planner
