// Memory per pipeline stage of a plan with tensor (+ sequence), pipeline and context parallelism:
// the stage's model states split by t and sharded over the data-parallel group by the
// ShardingSpec, and its activations for the micro-batches the schedule keeps in flight.
//
// The block is counted as Megatron-core's GPT keeps it (Korthikanti et al. 2022, "Reducing
// Activation Recomputation in Large Transformer Models", §4 and Table 2), whatever the job's
// recipe: tensor and sequence parallelism change which tensors are split, and that split is
// Megatron's (torchtitan's TP plan splits the same linears the same way). The executor's recipe
// with c = 1 is counted as its own model code keeps it (executor/gpt_model.hpp, and under tensor
// parallelism its vocabulary-parallel embedding and head, executor/tensor_parallel.hpp).
// DDP's bucket copy (ShardingSpec::grad_bucket_copy, torch DDP) is a buffer of the whole
// gradients; under it, on one stage holding the whole model, the executor's gradients are
// allocated at first use and the peak is the backward's worst moment (parallel_memory.cpp,
// executor_first_use_peak).
#pragma once

#include <string>
#include <vector>

#include "costmodel/accounting.hpp"
#include "costmodel/document_names.hpp"
#include "costmodel/parallel_layout.hpp"
#include "costmodel/pipeline_schedule.hpp"

namespace shardplan::costmodel {

// One transformer block's saved activations per micro-batch on one rank, in bytes, split by
// where they live. e: bytes of the compute dtype.
struct LayerActivations {
  double outside = 0;  // norms, their outputs feeding the linears, dropout masks: whole on every TP
                       // rank, split by t under sequence parallelism
  double inside = 0;   // q, k, v, the attention core, the MLP's inner tensors: split by t
  double core = 0;     // of `inside`, the attention core (what selective recompute drops)
  double total() const { return outside + inside; }
};
LayerActivations layer_activations(const ModelSpec& m, const TrainingJob& j,
                                   const ParallelLayout& l, double e);

// Elements one rank holds of a unit under tensor parallelism: matrices split by t (column- and
// row-parallel linears, the vocabulary-parallel embedding and head), vectors (norms, biases)
// whole — a column-parallel linear's bias is really split too, counted whole here (at most
// (1 − 1/t) of a few vectors per block). GPT-2's learned position table stays whole (Megatron
// keeps position embeddings replicated).
double tp_local_elements(const UnitTensors& u, int t, bool embedding);

struct StageMemory {
  int stage = 0;
  double blocks = 0;        // transformer blocks on the stage (all its chunks)
  double local_params = 0;  // elements this rank holds before data-parallel sharding
  double param_bytes = 0, grad_bytes = 0, optimizer_bytes = 0;
  double buffer_bytes = 0;      // gathered parameters, unsharded gradients, CP's K/V buffers
  double activation_bytes = 0;  // saved for the in-flight micro-batches plus the transients
  double in_flight = 0;         // micro-batches of the whole stage held at once (the walk's)
  double overhead_bytes = 0;    // CUDA context, NCCL workspace, fragmentation
  double total() const {
    return param_bytes + grad_bytes + optimizer_bytes + buffer_bytes + activation_bytes +
           overhead_bytes;
  }
};

struct ParallelMemory {
  std::vector<StageMemory> stages;
  int peak_stage = 0;
  double peak_bytes = 0;
  std::string peak_name;  // "stage 0 of 4 (embeddings, 32 blocks, 4 micro-batches in flight)"
};

struct ParallelMemoryInput {
  const ModelSpec* model = nullptr;
  const HardwareProfile* hardware = nullptr;
  Cluster cluster;
  TrainingJob job;  // micro_batch > 0
  ShardingSpec spec;
  ParallelLayout layout;
};

// Per stage, from the walk's in-flight micro-batches (walk.peak_in_flight per stage).
ParallelMemory parallel_memory(const ParallelMemoryInput& in, const PipelineWalk& walk);

}  // namespace shardplan::costmodel
