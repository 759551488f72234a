#include "executor/pipeline_run.hpp"

#include <algorithm>
#include <array>
#include <iostream>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/file_writer.hpp"
#include "core/input_error.hpp"
#include "core/number_text.hpp"
#include "core/text.hpp"
#include "core/version.hpp"
#include "documents/parallel.hpp"

namespace shardplan::executor {

using core::InputError;

void add_pipeline_options(CLI::App& app, PipelineTexts& t) {
  app.add_option("--pipeline-parallel", t.stages,
                 "run the plan's model on P pipeline stages (DDP over world / P ranks each) "
                 "[default: 1]");
  app.add_option("--schedule", t.schedule,
                 "pipeline schedule: 1f1b, interleaved-1f1b or gpipe [default: 1f1b]");
  app.add_option("--virtual-stages", t.virtual_stages,
                 "model chunks per stage, with --schedule interleaved-1f1b [default: 1]");
  app.add_option("--micro-batches", t.micro_batches,
                 "micro-batches per pipeline per step [default: the plan's micro-batch size]");
}

PipelineFlags read_pipeline_options(const CLI::App& app, const PipelineTexts& t,
                                    const std::string& refused_with) {
  PipelineFlags f;
  if (app.count("--pipeline-parallel")) {
    f.stages = core::int_from_text("--pipeline-parallel", t.stages);
    if (f.stages < 1)
      throw InputError("--pipeline-parallel", fmt::format("must be >= 1, got {}", f.stages));
  }
  if (app.count("--schedule")) f.schedule = documents::schedule_from_name(t.schedule, "--schedule");
  if (app.count("--virtual-stages")) {
    f.virtual_stages = core::int_from_text("--virtual-stages", t.virtual_stages);
    if (f.virtual_stages < 1)
      throw InputError("--virtual-stages", fmt::format("must be >= 1, got {}", f.virtual_stages));
  }
  if (app.count("--micro-batches")) {
    f.micro_batches = core::int_from_text("--micro-batches", t.micro_batches);
    if (f.micro_batches < 1)
      throw InputError("--micro-batches", fmt::format("must be >= 1, got {}", f.micro_batches));
  }
  for (const char* flag : {"--schedule", "--micro-batches", "--virtual-stages"})
    if (app.count(flag) && f.stages == 1)
      throw InputError(flag, "needs --pipeline-parallel P with P > 1");
  if (f.stages > 1 && !refused_with.empty())
    throw InputError("--pipeline-parallel",
                     fmt::format("{} is not run with pipeline stages (cpu backend under mpirun "
                                 "only, without checkpoints)",
                                 refused_with));
  return f;
}

PipelineOptions pipeline_options(const PipelineFlags& flags, const RunSetup& setup, int world) {
  const auto& e = setup.engine;
  PipelineOptions o;
  // Under tensor parallelism the setup's model is one rank's (run_setup.cpp): the stages take the
  // whole model and split it themselves.
  const auto& full = e.model_options.tensor_parallel.full;
  o.model = full != nullptr ? full->spec() : e.model;
  o.tensor_parallel = flags.tensor_parallel;
  o.sequence_parallel = flags.sequence_parallel;
  o.stages = flags.stages;
  o.schedule = flags.schedule;
  o.virtual_stages = flags.virtual_stages;
  o.checkpointing = e.checkpointing;
  o.adamw = e.adamw;
  o.seed = e.seed;
  o.model_options = e.model_options;
  o.model_options.tensor_parallel = {};  // the trainer's, over its own groups
  o.micro_batch = e.micro_batch;
  // The stages against the world and the model first; m, when the plan decides it, is checked
  // with the rest once known (below).
  o.micro_batches = flags.micro_batches > 0 ? flags.micro_batches : o.stages;
  check_pipeline(o, world);
  const std::int64_t d = world / (flags.stages * flags.tensor_parallel);
  // DDP, or ZeRO-1's sharded optimizer states over the whole stage (Megatron-core's distributed
  // optimizer); gradients and parameters stay whole.
  if (e.spec.shard_parameters || e.spec.shard_gradients ||
      (e.spec.shard_optimizer && e.spec.group(static_cast<int>(d)) != d))
    throw InputError("--pipeline-parallel",
                     fmt::format("the plan's strategy {} shards {} over the data-parallel "
                                 "group; pipeline stages run DDP or ZeRO-1 over their {} ranks "
                                 "(plan --strategy ddp or zero1)",
                                 e.spec.strategy,
                                 e.spec.shard_parameters  ? "parameters"
                                 : e.spec.shard_gradients ? "gradients"
                                                          : "optimizer states in smaller groups",
                                 d));
  if (e.spec.shard_optimizer) o.optimizer_shards = static_cast<int>(d);
  if (setup.plan.job.precision != documents::Precision::fp32)
    throw InputError("--pipeline-parallel", "pipeline stages compute in fp32 only (plan "
                                            "--precision fp32)");
  const std::int64_t per_rank = setup.global_batch / d;
  if (setup.global_batch % d != 0)
    throw InputError("--pipeline-parallel",
                     fmt::format("the global batch of {} sequences does not split over the {} "
                                 "data-parallel ranks (world {} / P {} / T {})",
                                 setup.global_batch, d, world, flags.stages,
                                 flags.tensor_parallel));
  const std::int64_t m =
      flags.micro_batches > 0 ? flags.micro_batches : per_rank / e.micro_batch.batch;
  if (m < 1 || per_rank % m != 0)
    throw InputError("--micro-batches",
                     fmt::format("{} does not divide the {} sequences per data-parallel rank "
                                 "(global batch {} over d = {})",
                                 m, per_rank, setup.global_batch, d));
  o.micro_batches = static_cast<int>(m);
  o.micro_batch.batch = per_rank / m;
  check_pipeline(o, world);
  return o;
}

namespace {

// What one rank measured: its peak and the categories at the peak.
constexpr std::size_t kRecord = 1 + kMemoryCategoryCount;
std::array<std::int64_t, kRecord> rank_record(const TrackedAllocator& a) {
  std::array<std::int64_t, kRecord> r{};
  r[0] = a.peak_bytes();
  const auto at_peak = a.breakdown_at_peak();
  for (std::size_t c = 0; c < kMemoryCategoryCount; ++c) r[1 + c] = at_peak[kMemoryCategories[c]];
  return r;
}

// Per stage: what the trainer allocates at its peak (pipeline.hpp, stage_peak); none with tensor
// parallelism, which stage_peak does not count.
nlohmann::json counted_stages(const PipelineOptions& o) {
  nlohmann::json out = nlohmann::json::array();
  for (int s = 0; s < o.stages && o.tensor_parallel == 1; ++s) {
    const auto peak = stage_peak(o, s);
    out.push_back({{"total_bytes", peak.total()},
                   {"state_bytes", peak.states},
                   {"saved_bytes_per_micro_batch", peak.saved},
                   {"in_flight", peak.in_flight},
                   {"transient_bytes", peak.transient}});
  }
  return out;
}

// Per stage: the largest peak over its ranks, with that rank's categories at the peak.
nlohmann::json measured_stages(const std::vector<std::int64_t>& records, int stages, int world) {
  const int d = world / stages;
  nlohmann::json out = nlohmann::json::array();
  for (int s = 0; s < stages; ++s) {
    std::size_t worst = static_cast<std::size_t>(s * d) * kRecord;
    for (int r = s * d; r < (s + 1) * d; ++r)
      if (records[static_cast<std::size_t>(r) * kRecord] > records[worst])
        worst = static_cast<std::size_t>(r) * kRecord;
    nlohmann::json stage = {{"peak_bytes", records[worst]}};
    for (std::size_t c = 0; c < kMemoryCategoryCount; ++c)
      stage[fmt::format("{}_bytes_at_peak", category_name(kMemoryCategories[c]))] =
          records[worst + 1 + c];
    out.push_back(stage);
  }
  return out;
}

}  // namespace

void run_pipeline(const PipelineFlags& flags, const RunSetup& setup, comm::Communicator& world,
                  std::int64_t steps, const std::string& out, std::int64_t capacity_bytes) {
  const int n = world.size();
  const PipelineOptions o = pipeline_options(flags, setup, n);
  auto groups = make_pipeline_groups(world, o.stages, o.tensor_parallel);
  TrackedAllocator allocator(capacity_bytes);
  nlohmann::json step_docs = nlohmann::json::array();
  {
    PipelineTrainer trainer(o, allocator, groups);
    for (std::int64_t k = 0; k < steps; ++k) {
      const auto r = trainer.step();
      if (world.rank() == 0)
        std::cerr << fmt::format("executor: step {}/{}: loss {:.4f}, {:.3f} s, stage 0 peak {:.1f} "
                                 "MiB\n",
                                 r.step, steps, r.loss, r.step_s,
                                 static_cast<double>(allocator.peak_bytes()) / (1 << 20));
      step_docs.push_back({{"step", r.step},
                           {"loss", r.loss},
                           {"step_s", r.step_s},
                           {"forward_s", r.forward_s},
                           {"backward_s", r.backward_s},
                           {"p2p_s", r.p2p_s},
                           {"reduce_s", r.reduce_s},
                           {"optimizer_s", r.optimizer_s}});
    }
  }
  const auto mine = rank_record(allocator);
  std::vector<std::int64_t> records(static_cast<std::size_t>(n) * kRecord);
  world.all_gather(mine.data(), records.data(), kRecord, comm::DataType::i64);
  if (world.rank() != 0) return;
  const nlohmann::json doc = {{"schema_version", 1},
                              {"generator", core::generator()},
                              {"kind", "executor pipeline run"},
                              {"model", o.model.name},
                              {"strategy", setup.engine.spec.strategy},
                              {"world", n},
                              {"pipeline",
                               {{"pipeline_parallel", o.stages},
                                {"data_parallel", n / (o.stages * o.tensor_parallel)},
                                {"schedule", documents::schedule_name(o.schedule)},
                                {"virtual_stages", o.virtual_stages},
                                {"tensor_parallel", o.tensor_parallel},
                                {"sequence_parallel", o.sequence_parallel},
                                {"micro_batches", o.micro_batches},
                                {"micro_batch", o.micro_batch.batch},
                                {"seq_len", o.micro_batch.seq}}},
                              {"steps", step_docs},
                              {"stages_measured", measured_stages(records, o.stages, n)},
                              {"stages_counted", counted_stages(o)}};
  core::write_file(out, core::json_text(doc, 2) + "\n", "--out");
}

}  // namespace shardplan::executor
