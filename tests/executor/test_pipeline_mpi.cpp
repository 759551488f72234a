// Pipeline parallelism under mpirun: p stages (× d data-parallel replicas) train exactly as one
// process running the sharding engine's DDP with gradient accumulation over the same
// micro-batches (m·d of them, in the order the data layout gives both), for 1F1B and GPipe, a
// Llama-like and a GPT-2-like (tied head) model.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/input_error.hpp"
#include "costmodel/parallel_step.hpp"
#include "costmodel/pipeline_schedule.hpp"
#include "engine_fixture.hpp"
#include "executor/pipeline.hpp"
#include "executor/tensor_parallel.hpp"
#include "mpi_test_world.hpp"

using namespace shardplan;
using namespace shardplan::executor;
using namespace shardplan::kernels;
using namespace shardplan::executor::testing;
using documents::PipelineSchedule;

namespace {

// Tolerances, fp32. Within a micro-batch every stage runs the very kernels of the one-process
// run in the same order, and each stage accumulates its gradients over the micro-batches in the
// same order (1F1B and GPipe both run the backwards in micro-batch order). What differs is the
// order of some fp32 sums: with d > 1 the
// m·d micro-batch gradients are summed as d partial sums of m and an all-reduce of the d (the
// reference adds all m·d into one buffer), and a tied wte's two paths (embedding, head) are
// accumulated in two buffers and added once. Each reordering changes a gradient by a few ulps
// (relative ~1e-7), as between the sharding engine's strategies (test_engine_mpi.cpp), whose
// bounds hold here for the same reason: losses (means of fp32 terms ~4 summed in double) to 1e-6
// relative, parameters after AdamW with lr = 1e-2 to 2e-5 absolute. A lost or doubled
// micro-batch, a wrong loss scale or a stale tied copy moves parameters by O(lr) = 1e-2.
// Measured over every case below: parameters within 3.0e-6, losses within 7e-9 relative (4 ranks).
constexpr double kLossTolerance = 1e-6;
constexpr double kParamTolerance = 2e-5;
constexpr int kSteps = 2;
const BatchShape kMicroBatch{2, 8};
constexpr double kLr = 1e-2;
constexpr std::uint64_t kSeed = 77;

// The reference: this rank alone (a group of one) runs DDP with m·d micro-batches per step.
EngineRun reference(const documents::ModelSpec& model, int micro_batches) {
  auto solo = test_world().split(test_world().rank(), 0);
  auto o = test_options(model, test_spec("ddp", documents::Flavour::ddp, 1), micro_batches);
  o.micro_batch = kMicroBatch;
  o.adamw.lr = kLr;
  o.seed = kSeed;
  return run_engine(o, {solo.get(), solo.get(), nullptr, false}, kSteps);
}

struct PipelineRun {
  std::vector<double> losses;
  std::vector<std::int64_t> units;  // the units this rank holds
  std::vector<std::vector<float>> params;
  std::int64_t peak_bytes = 0;
};

PipelineOptions pipeline_options(const documents::ModelSpec& model, int p, int m,
                                 PipelineSchedule schedule, int v = 1) {
  PipelineOptions o;
  o.virtual_stages = v;
  o.model = model;
  o.micro_batch = kMicroBatch;
  o.stages = p;
  o.micro_batches = m;
  o.schedule = schedule;
  o.adamw.lr = kLr;
  o.seed = kSeed;
  return o;
}

PipelineRun run_pipeline(const PipelineOptions& o) {
  auto groups = make_pipeline_groups(test_world(), o.stages);
  TrackedAllocator allocator;
  PipelineRun r;
  {
    PipelineTrainer trainer(o, allocator, groups);
    for (int k = 0; k < kSteps; ++k) r.losses.push_back(trainer.step().loss);
    const auto chunks = trainer.units();
    const std::int64_t count = trainer.layout().unit_count();
    const bool tied_copy = trainer.layout().head().output == kAbsent && chunks.back().last == count;
    for (std::int64_t unit = 0; unit < count; ++unit) {
      bool held = unit == 0 && tied_copy;
      for (const auto& u : chunks) held = held || (unit >= u.first && unit < u.last);
      if (!held) continue;
      const auto p = trainer.parameters(unit);
      r.units.push_back(unit);
      r.params.emplace_back(p.begin(), p.end());
    }
  }
  r.peak_bytes = allocator.peak_bytes();
  return r;
}

double worst_param_difference = 0, worst_loss_error = 0;  // over every comparison, for the log

void check_against(const PipelineRun& run, const EngineRun& ref) {
  REQUIRE(run.losses.size() == ref.losses.size());
  for (std::size_t k = 0; k < run.losses.size(); ++k) {
    CHECK(run.losses[k] == doctest::Approx(ref.losses[k]).epsilon(kLossTolerance));
    worst_loss_error =
        std::max(worst_loss_error, std::abs(run.losses[k] - ref.losses[k]) / ref.losses[k]);
  }
  REQUIRE(!run.units.empty());
  for (std::size_t i = 0; i < run.units.size(); ++i) {
    const auto& want = ref.params[static_cast<std::size_t>(run.units[i])];
    const auto& got = run.params[i];
    REQUIRE(got.size() == want.size());
    double worst = 0;
    for (std::size_t e = 0; e < got.size(); ++e)
      worst = std::max(worst, std::abs(static_cast<double>(got[e]) - static_cast<double>(want[e])));
    CAPTURE(run.units[i]);
    CHECK(worst <= kParamTolerance);
    worst_param_difference = std::max(worst_param_difference, worst);
  }
}

struct Layout {
  int p, m;
};

// The layouts this world size runs: every p dividing it (d = world / p), m below, at and above p.
std::vector<Layout> layouts(int world) {
  std::vector<Layout> out;
  for (int p = 1; p <= world; ++p)
    if (world % p == 0)
      for (int m : {1, p, p + 1}) out.push_back({p, m});
  return out;
}

// The cost model's per-stage memory for the same layout as `planner estimate` walks it
// (costmodel::simulate_parallel_step), the job as the executor runs it (its own model code, fp32,
// eager attention, DDP, a CPU device without per-device overheads). Pipelines of two or more
// stages: the executor's program runs one stage with its engine, one micro-batch at a time
// (executor/run_command.cpp), as the cost model's one-stage walk does, not with the pipeline
// trainer these tests also run at p = 1 (whose GPipe keeps every micro-batch in flight).
double predicted_stage_bytes(const PipelineOptions& o, int world, int stage,
                             const Strategy& strategy = {"ddp", documents::Flavour::ddp}) {
  const auto hw = cpu_profile(world);
  costmodel::StepInput in;
  in.model = &o.model;
  in.hardware = &hw;
  in.cluster = {world, world};
  in.job.seq_len = o.micro_batch.seq;
  in.job.micro_batch = o.micro_batch.batch;
  const int d = world / (o.stages * o.tensor_parallel);
  in.job.global_batch = o.micro_batch.batch * o.micro_batches * d;
  in.job.precision = documents::Precision::fp32;
  in.job.optimizer = documents::Optimizer::adamw;
  in.job.attention = documents::AttentionImpl::eager;
  in.job.recipe = documents::Recipe::executor;
  in.job.checkpointing = documents::Checkpointing::none;
  in.spec = test_spec(strategy.name, strategy.flavour, d);
  in.spec.grad_bucket_copy = false;  // the stages reduce in place (as pipeline_run.cpp predicts)
  documents::ParallelLayout l;
  l.pipeline_parallel = o.stages;
  l.schedule = o.schedule;
  l.micro_batches = o.micro_batches;
  l.virtual_stages = o.virtual_stages;
  l.tensor_parallel = o.tensor_parallel;
  l.sequence_parallel = o.sequence_parallel;
  const auto r = costmodel::simulate_parallel_step(in, l);
  REQUIRE_MESSAGE(r.step.valid, r.step.reason);
  if (l.trivial()) return r.step.peak_bytes;  // one stage: the 1D walk's
  return r.memory.stages.at(static_cast<std::size_t>(stage)).total();
}

}  // namespace

TEST_CASE("pipeline::stages of 1F1B and GPipe train as one process with accumulation") {
  const int world = test_world().size();
  const std::int64_t layers = world <= 2 ? 4 : world;  // divisible by every p of the world
  for (const bool tied : {false, true}) {
    const auto model = tied ? tiny_gpt2(layers) : tiny_llama(layers);
    for (const auto layout : layouts(world)) {
      const int d = world / layout.p;
      const auto ref = reference(model, layout.m * d);
      for (auto schedule : {PipelineSchedule::one_f_one_b, PipelineSchedule::gpipe}) {
        CAPTURE(tied);
        CAPTURE(layout.p);
        CAPTURE(layout.m);
        CAPTURE(documents::schedule_name(schedule));
        check_against(run_pipeline(pipeline_options(model, layout.p, layout.m, schedule)), ref);
      }
    }
  }
  if (test_world().rank() == 0)
    MESSAGE("pipeline on " << world << " ranks: worst loss error " << worst_loss_error
                           << ", worst parameter difference " << worst_param_difference);
}

// The interleaved schedule (Megatron-LM's, v = 2 model chunks per stage): every p >= 3 dividing
// the world, m = p and 2p, against one process with accumulation, and each stage's measured peak
// against stage_peak's count (the chunks alive at once in the stage's order) and the cost model's
// prediction for the same layout (to the byte). Measured on 3, 4 and 8 ranks: see the message.
TEST_CASE("pipeline::the interleaved schedule trains as one process, its peaks as counted") {
  const int world = test_world().size();
  double worst_count = 0, worst_model = 0;
  for (int p = 3; p <= world; ++p) {
    if (world % p != 0) continue;
    const int d = world / p, v = 2;
    for (const bool tied : {false, true}) {
      const auto model = tied ? tiny_gpt2(std::int64_t{p} * v) : tiny_llama(std::int64_t{p} * v);
      for (const int m : {p, 2 * p}) {
        const auto o = pipeline_options(model, p, m, PipelineSchedule::interleaved_1f1b, v);
        const auto run = run_pipeline(o);
        CAPTURE(tied);
        CAPTURE(p);
        CAPTURE(m);
        check_against(run, reference(model, m * d));
        const int stage = test_world().rank() / d;
        const auto want = stage_peak(o, stage);
        CAPTURE(stage);
        CAPTURE(want.held);
        CAPTURE(want.transient);
        CAPTURE(run.peak_bytes);
        const double error =
            std::abs(static_cast<double>(run.peak_bytes) / static_cast<double>(want.total()) - 1);
        CHECK(error <= 0.03);
        worst_count = std::max(worst_count, error);
        const double predicted = predicted_stage_bytes(o, world, stage);
        CAPTURE(predicted);
        const double model_error = std::abs(static_cast<double>(run.peak_bytes) / predicted - 1);
        CHECK(model_error == 0.0);  // to the byte
        worst_model = std::max(worst_model, model_error);
      }
    }
  }
  if (world >= 3)
    MESSAGE("rank " << test_world().rank() << ", interleaved: worst stage peak error "
                    << worst_count << " against the count, " << worst_model
                    << " against the cost model");
}

// Tensor parallelism inside the stages (torchtitan's and Megatron-LM's 2D layout, mesh order
// pp, dp, tp): every p >= 2 with t = 2 (the fixture models' heads, key/value heads, MLP width and
// vocabulary divide by 2) and d = world / (p·t), with and without sequence parallelism, against
// one process with accumulation: the parameters each stage holds are gathered whole over its
// tensor-parallel group (gather_full_unit) and compared as above. Each stage's measured peak
// against the cost model's prediction for the same layout (t = 2 and sequence parallelism in
// it), to the byte (measured on 4 and 8 ranks). The sums TP reorders (a row-parallel output
// from t partial products) are of the same size as DDP's: the same tolerances.
TEST_CASE("pipeline::tensor parallelism within the stages trains as one process") {
  const int world = test_world().size(), t = 2;
  double worst_model = 0;
  for (int p = 2; p * t <= world; ++p) {
    if (world % (p * t) != 0) continue;
    const int d = world / (p * t);
    for (const bool tied : {false, true}) {
      const auto model = tied ? tiny_gpt2(2 * std::int64_t{p}) : tiny_llama(2 * std::int64_t{p});
      const auto ref = reference(model, p * d);
      for (const bool sequence_parallel : {false, true}) {
        auto o = pipeline_options(model, p, p, PipelineSchedule::one_f_one_b);
        o.tensor_parallel = t;
        o.sequence_parallel = sequence_parallel;
        auto groups = make_pipeline_groups(test_world(), p, t);
        TrackedAllocator allocator;
        PipelineRun run;
        {
          PipelineTrainer trainer(o, allocator, groups);
          for (int k = 0; k < kSteps; ++k) run.losses.push_back(trainer.step().loss);
          const TensorParallel tp{groups.tensor.get(), sequence_parallel,
                                  std::make_shared<const GptLayout>(model)};
          const std::int64_t count = trainer.layout().unit_count();
          const auto chunks = trainer.units();
          const bool tied_copy =
              trainer.layout().head().output == kAbsent && chunks.back().last == count;
          for (std::int64_t unit = 0; unit < count; ++unit) {
            bool held = unit == 0 && tied_copy;
            for (const auto& u : chunks) held = held || (unit >= u.first && unit < u.last);
            if (!held) continue;
            run.units.push_back(unit);
            run.params.push_back(
                gather_full_unit(tp, trainer.layout(), unit, trainer.parameters(unit)));
          }
        }
        run.peak_bytes = allocator.peak_bytes();
        CAPTURE(tied);
        CAPTURE(p);
        CAPTURE(d);
        CAPTURE(sequence_parallel);
        check_against(run, ref);
        const int stage = test_world().rank() / (d * t);
        const double predicted = predicted_stage_bytes(o, world, stage);
        CAPTURE(stage);
        CAPTURE(run.peak_bytes);
        CAPTURE(predicted);
        const double model_error = std::abs(static_cast<double>(run.peak_bytes) / predicted - 1);
        CHECK(model_error == 0.0);  // to the byte
        worst_model = std::max(worst_model, model_error);
      }
    }
  }
  if (world >= 4)
    MESSAGE("rank " << test_world().rank() << ", tensor parallel within stages: worst stage peak "
                    << "error " << worst_model << " against the cost model");
}

// Each rank's measured peak (the tracked allocator's) against stage_peak's count of what the
// trainer allocates, for both schedules: the in-flight micro-batches come from the cost model's
// walk, the bytes per micro-batch from the model's own saved-bytes functions; and against the cost
// model's per-stage prediction for the same layout (predicted_stage_bytes, the executor's recipe,
// p >= 2), to the byte. The count's target is 3%: see the messages.
TEST_CASE(
    "pipeline::each stage's peak is the walk's in-flight micro-batches times the saved bytes") {
  const int world = test_world().size();
  const std::int64_t layers = world <= 2 ? 4 : world;
  double worst = 0, worst_model = 0;
  for (const bool tied : {false, true}) {
    const auto model = tied ? tiny_gpt2(layers) : tiny_llama(layers);
    for (int p = 1; p <= world; ++p) {
      if (world % p != 0) continue;
      for (auto schedule : {PipelineSchedule::one_f_one_b, PipelineSchedule::gpipe}) {
        const auto o = pipeline_options(model, p, 2 * p, schedule);
        const auto run = run_pipeline(o);
        const int stage = test_world().rank() / (world / p);
        const auto want = stage_peak(o, stage);
        CAPTURE(tied);
        CAPTURE(p);
        CAPTURE(stage);
        CAPTURE(documents::schedule_name(schedule));
        CAPTURE(want.states);
        CAPTURE(want.saved);
        CAPTURE(want.in_flight);
        CAPTURE(want.transient);
        CAPTURE(run.peak_bytes);
        const double error =
            std::abs(static_cast<double>(run.peak_bytes) / static_cast<double>(want.total()) - 1);
        CHECK(error <= 0.03);
        worst = std::max(worst, error);
        if (p == 1) continue;  // one stage: see predicted_stage_bytes
        const double predicted = predicted_stage_bytes(o, world, stage);
        CAPTURE(predicted);
        const double model_error = std::abs(static_cast<double>(run.peak_bytes) / predicted - 1);
        CHECK(model_error == 0.0);  // to the byte
        worst_model = std::max(worst_model, model_error);
      }
    }
  }
  MESSAGE("rank " << test_world().rank() << ": worst stage peak error " << worst
                  << " against the count, " << worst_model << " against the cost model");
}

// ZeRO-1 within the stages (Megatron-core's distributed optimizer over each stage's d ranks,
// pipeline.hpp): the same training as one process (the moments' ranges step the same elements),
// and each rank's peak against stage_peak's count (data-parallel rank 0's ranges, the largest)
// (3%) and the cost model's prediction for the layout with ZeRO-1's spec (moments / d), to the
// byte.
TEST_CASE("pipeline::ZeRO-1 over each stage's ranks trains as one process, its peaks as counted") {
  const int world = test_world().size();
  const std::int64_t layers = world <= 2 ? 4 : world;
  double worst = 0, worst_model = 0;
  for (const bool tied : {false, true}) {
    const auto model = tied ? tiny_gpt2(layers) : tiny_llama(layers);
    for (int p = 1; p <= world; ++p) {
      const int d = world / p;
      if (world % p != 0 || d < 2) continue;
      auto o = pipeline_options(model, p, p, PipelineSchedule::one_f_one_b);
      o.optimizer_shards = d;
      CAPTURE(tied);
      CAPTURE(p);
      const auto run = run_pipeline(o);
      check_against(run, reference(model, p * d));
      const int stage = test_world().rank() / d;
      CAPTURE(stage);
      const double counted = static_cast<double>(stage_peak(o, stage).total());
      const double error = std::abs(static_cast<double>(run.peak_bytes) / counted - 1);
      CHECK(error <= 0.03);
      worst = std::max(worst, error);
      if (p == 1) continue;  // one stage: see predicted_stage_bytes
      const double predicted =
          predicted_stage_bytes(o, world, stage, {"zero1", documents::Flavour::deepspeed});
      CAPTURE(predicted);
      CAPTURE(run.peak_bytes);
      const double model_error = std::abs(static_cast<double>(run.peak_bytes) / predicted - 1);
      CHECK(model_error == 0.0);  // to the byte
      worst_model = std::max(worst_model, model_error);
    }
  }
  if (world > 1)
    MESSAGE("rank " << test_world().rank() << ", ZeRO-1 stages: worst peak error " << worst
                    << " against the count, " << worst_model << " against the cost model");
}

TEST_CASE("pipeline::stage_units splits the blocks evenly, embedding first, head last") {
  // 8 blocks on 4 stages: units 0 (embedding) + 1,2 | 3,4 | 5,6 | 7,8 + 9 (head).
  CHECK(stage_units(8, 4, 0).first == 0);
  CHECK(stage_units(8, 4, 0).last == 3);
  CHECK(stage_units(8, 4, 1).first == 3);
  CHECK(stage_units(8, 4, 1).last == 5);
  CHECK(stage_units(8, 4, 3).first == 7);
  CHECK(stage_units(8, 4, 3).last == 10);
  CHECK(stage_units(8, 1, 0).last == 10);
}

TEST_CASE("pipeline::check_pipeline rejects what cannot run, naming the flag and the value") {
  auto expect = [](const PipelineOptions& o, int world, const std::string& flag,
                   const std::string& text) {
    try {
      check_pipeline(o, world);
      FAIL("accepted");
    } catch (const core::InputError& e) {
      CHECK(e.where() == flag);
      CHECK(std::string(e.what()).find(text) != std::string::npos);
    }
  };
  const auto o = pipeline_options(tiny_llama(4), 2, 2, PipelineSchedule::one_f_one_b);
  auto bad = o;
  bad.stages = 3;
  expect(bad, 6, "--pipeline-parallel", "3 does not divide the model's 4 layers");
  expect(o, 3, "--pipeline-parallel", "2 does not divide the 3 ranks");
  bad = o;
  bad.stages = 0;
  expect(bad, 2, "--pipeline-parallel", "must be >= 1, got 0");
  bad = o;
  bad.micro_batches = 0;
  expect(bad, 2, "--micro-batches", "must be >= 1, got 0");
  bad = o;
  bad.virtual_stages = 2;
  expect(bad, 2, "--virtual-stages", "2 needs --schedule interleaved-1f1b, got 1f1b");
  // The interleaved schedule: chunks, stages, layers and micro-batches.
  const auto interleaved =
      pipeline_options(tiny_llama(6), 3, 3, PipelineSchedule::interleaved_1f1b, 2);
  CHECK_NOTHROW(check_pipeline(interleaved, 3));
  bad = interleaved;
  bad.virtual_stages = 1;
  expect(bad, 3, "--virtual-stages", "the interleaved-1f1b schedule needs >= 2, got 1");
  bad = pipeline_options(tiny_llama(4), 2, 2, PipelineSchedule::interleaved_1f1b, 2);
  expect(bad, 2, "--pipeline-parallel", "the interleaved-1f1b schedule runs on >= 3 stages, got 2");
  bad = interleaved;
  bad.virtual_stages = 4;
  expect(bad, 3, "--virtual-stages", "3 stages x 4 chunks do not divide the model's 6 layers");
  bad = interleaved;
  bad.micro_batches = 4;
  expect(bad, 3, "--micro-batches", "needs a multiple of the 3 stages, got 4");
  CHECK_NOTHROW(check_pipeline(o, 4));
}

TEST_CASE("pipeline::chunk_units gives virtual stage chunk·p + stage its blocks") {
  // 8 blocks over p = 2 stages × v = 2 chunks: 2 blocks per virtual stage; stage 0 holds virtual
  // stages 0 (the embedding, blocks 1–2) and 2 (blocks 5–6), stage 1 holds 1 (blocks 3–4) and 3
  // (blocks 7–8, the head).
  CHECK(chunk_units(8, 2, 2, 0, 0).first == 0);
  CHECK(chunk_units(8, 2, 2, 0, 0).last == 3);
  CHECK(chunk_units(8, 2, 2, 1, 0).first == 3);
  CHECK(chunk_units(8, 2, 2, 1, 0).last == 5);
  CHECK(chunk_units(8, 2, 2, 0, 1).first == 5);
  CHECK(chunk_units(8, 2, 2, 0, 1).last == 7);
  CHECK(chunk_units(8, 2, 2, 1, 1).first == 7);
  CHECK(chunk_units(8, 2, 2, 1, 1).last == 10);
}
