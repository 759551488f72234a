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

#include <vector>

#include "costmodel/accounting.hpp"
#include "costmodel/block_table.hpp"
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

// A block's memory-bound ops as the recipe's model code runs them, in the forward's order (the
// rows beside the block's saved tensors, block_table.hpp): each op's bytes and kernels per
// micro-batch, where tensor parallelism puts it (`residual`: the norms and residual adds on the
// residual stream, whole on every rank unless sequence parallelism splits them along the
// sequence; `heads`: on the rank's heads and intermediate width), and whether it closes the block
// (the residual adds after the last op whose output backward keeps, which torch.utils.checkpoint's
// early stop does not rerun). The eager block's; under compile block_traffic replaces its forward.
struct BlockOp {
  const char* op;
  Traffic moved;
  Placement place = Placement::heads;
  bool closes = false;
};
std::vector<BlockOp> block_ops(const documents::ModelSpec& m, const documents::TrainingJob& j,
                               const Forward& f);

// One block (the sum of its ops), the head (final norm, projection's casts, loss), the embeddings.
Traffic block_traffic(const documents::ModelSpec& m, const documents::TrainingJob& j,
                      const Forward& f);
// What a checkpointed block's backward reruns of its forward (forward and forward_ops).
Traffic recompute_traffic(const documents::ModelSpec& m, const documents::TrainingJob& j,
                          const Forward& f);
Traffic head_traffic(const documents::ModelSpec& m, const documents::TrainingJob& j,
                     const Forward& f);
Traffic embedding_traffic(const documents::ModelSpec& m, const documents::TrainingJob& j,
                          const Forward& f);
// Of the block's ops, those on the residual stream (Placement::residual).
Traffic block_residual_traffic(const documents::ModelSpec& m, const documents::TrainingJob& j,
                               const Forward& f);

}  // namespace shardplan::costmodel
