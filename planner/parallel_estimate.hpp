// `planner estimate` with tensor, pipeline and context parallelism: the flags, the layout they
// make with the scenario's batch; the report is estimate.hpp's, one document for every layout.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "costmodel/parallel_step.hpp"
#include "planner/scenario.hpp"

namespace shardplan::planner {

// As given on the command line (nullopt / false: not given).
struct ParallelOptions {
  std::optional<std::string> tensor_parallel, pipeline_parallel, schedule, virtual_stages,
      micro_batches, context_parallel, first_stage_less_layers, last_stage_less_layers,
      cp_rotate_method;
  bool sequence_parallel = false;
  bool async_tensor_parallel = false;
  bool given() const {
    return tensor_parallel || pipeline_parallel || schedule || virtual_stages || micro_batches ||
           context_parallel || sequence_parallel || async_tensor_parallel ||
           first_stage_less_layers || last_stage_less_layers || cp_rotate_method;
  }
  // Only t, p or c given, each as 1: the one-dimensional layout, estimated as if not given.
  bool one_dimensional() const;
};
void add_parallel_options(CLI::App& app, ParallelOptions& o);

// The layout of the flags, its micro-batches and the job's micro-batch made to agree with the
// global batch over the data-parallel ranks (one given: the other follows; neither: micro-batch
// 1), checked against the model and cluster. Sets sc.job.micro_batch. Throws InputError naming
// the flags and the reasons.
documents::ParallelLayout layout_from_options(const ParallelOptions& o, Scenario& sc);

}  // namespace shardplan::planner
