// The bytes a unit's memory-bound kernels read and write, as the recipe's own model code runs
// them: norms written out in ops or fused, autocast's casts of each GEMM's input and weight, the
// rotary embedding's ops, residual adds, the MLP's activation, the embedding lookup and its dense
// gradient, the loss's upcast and log-softmax, gradient adds where a tensor feeds several GEMMs.
// The same recipes and dtypes as the activation accounting (accounting.hpp's Forward), derived per
// op from each framework's model code and checked against the ATen ops PyTorch dispatches for
// them (tests/costmodel/data/oracle_traffic.json, validation/measure_traffic.py).
//
// Units: bytes per micro-batch. A checkpointed block's backward adds its forward's traffic again.
#pragma once

#include <optional>

#include "costmodel/accounting.hpp"
#include "documents/job.hpp"
#include "documents/model.hpp"

namespace shardplan::costmodel {

struct Traffic {
  double forward = 0;      // bytes read + written by the unit's forward (the head's: with the loss)
  double backward = 0;     // bytes of its backward, without a checkpointed block's recompute
  double forward_ops = 0;  // the memory-bound kernels that move them (each one launch)
  double backward_ops = 0;
};

// The recipes whose model code is counted here: hf, deepspeed, llm-foundry (transformers' model
// code), torchtitan. The executor and Megatron-core run fused kernels whose passes are counted in
// elementwise.hpp; for those this returns nothing.
bool counts_recipe_traffic(const documents::TrainingJob& j);

// One block, the head (final norm, projection's casts, loss), the embeddings.
Traffic block_traffic(const documents::ModelSpec& m, const documents::TrainingJob& j,
                      const Forward& f);
// What a checkpointed block's backward reruns of its forward (forward and forward_ops).
Traffic recompute_traffic(const documents::ModelSpec& m, const documents::TrainingJob& j,
                          const Forward& f);
Traffic head_traffic(const documents::ModelSpec& m, const documents::TrainingJob& j,
                     const Forward& f);
Traffic embedding_traffic(const documents::ModelSpec& m, const documents::TrainingJob& j,
                          const Forward& f);
// Of block_traffic, the ops on the residual stream's width (the two norms and the residual adds),
// which tensor parallelism leaves whole on every rank unless sequence parallelism splits them along
// the sequence; the rest runs on a rank's heads and intermediate width.
Traffic block_residual_traffic(const documents::ModelSpec& m, const documents::TrainingJob& j,
                               const Forward& f);

}  // namespace shardplan::costmodel
