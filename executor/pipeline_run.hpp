// The executor's pipeline-parallel run (executor/pipeline.hpp) under mpirun: its flags
// (--pipeline-parallel P, --schedule 1f1b|gpipe, --micro-batches M, the planner's names), the
// options it makes from the plan, the steps, and the run document with each stage's measured peak
// beside the trainer's own count of it (pipeline.hpp, stage_peak); `planner validate` predicts
// the same stages from the plan.
#pragma once

#include <cstdint>
#include <string>

#include "comm/communicator.hpp"
#include "documents/parallel.hpp"
#include "executor/pipeline.hpp"
#include "executor/run_setup.hpp"

namespace CLI {
class App;
}

namespace shardplan::executor {

struct PipelineFlags {
  int stages = 1;  // p; 1: no pipeline (the sharding engine runs the plan)
  documents::PipelineSchedule schedule = documents::PipelineSchedule::one_f_one_b;
  int micro_batches = 0;   // m per pipeline per step; 0: the plan's micro-batch size decides
  int virtual_stages = 1;  // v: model chunks per stage (interleaved-1f1b)
  // --tensor-parallel and --sequence-parallel (the run's request): TP inside each stage.
  int tensor_parallel = 1;
  bool sequence_parallel = false;
};

// The flags as given, as text (converted after parsing, as the other numbers are).
struct PipelineTexts {
  std::string stages, schedule, micro_batches, virtual_stages;
};
void add_pipeline_options(CLI::App& app, PipelineTexts& texts);
// Throws core::InputError naming the flag and the value: P or M not a whole number >= 1, a
// schedule that is not one of the planner's names, M or --schedule without P > 1, or P > 1 with
// what a pipeline run does not do (rehearse_or_gpu names it: "--rehearse-rank", "--backend",
// "--save", "--resume", "--collective-streams"; empty when none).
PipelineFlags read_pipeline_options(const CLI::App& app, const PipelineTexts& texts,
                                    const std::string& refused_with);

// The pipeline's options for the plan's setup on `world` ranks: d = world / P; each data-parallel
// rank's share of the global batch, B / d sequences, split into M micro-batches (default: of the
// plan's micro-batch size). Throws InputError: M not dividing B / d, P not dividing the world or
// the layers, a sharded strategy (pipeline stages run DDP over their data-parallel group only).
PipelineOptions pipeline_options(const PipelineFlags& flags, const RunSetup& setup, int world);

// Runs the steps, prints each step's loss on world rank 0, and writes the run document there.
// Collective over `world`.
void run_pipeline(const PipelineFlags& flags, const RunSetup& setup, comm::Communicator& world,
                  std::int64_t steps, const std::string& out, std::int64_t capacity_bytes);

}  // namespace shardplan::executor
