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
#include "documents/workload.hpp"

namespace shardplan::costmodel {

struct Traffic {
  double forward = 0;      // bytes read + written by the unit's forward (the head's: with the loss)
  double backward = 0;     // bytes of its backward, without a checkpointed block's recompute
  double forward_ops = 0;  // the memory-bound kernels that move them (each one launch)
  double backward_ops = 0;
};

// Where an op's bytes fall over the ranks of a tensor-parallel group (compute_time.hpp,
// TensorSplit):
//   residual    on the residual stream's tokens (norms, residual adds, the embeddings' rows):
//               whole on every rank, split along the sequence under sequence parallelism
//   heads       on the rank's heads and intermediate width, and its shard of the weights: by t
//   vocabulary  over the logits (the head's casts and loss): by t where the loss runs on the
//               rank's vocabulary columns, whole where it runs on gathered logits
enum class OpSpread { residual, heads, vocabulary };

// A unit's memory-bound ops as the recipe's model code runs them, in the forward's order (the
// block's rows beside its saved tensors, block_table.hpp): each op's bytes and kernels per
// micro-batch, where tensor parallelism puts it, and whether it closes the block (the residual
// adds after the last op whose output backward keeps, which torch.utils.checkpoint's early stop
// does not rerun). A framework's eager code op by op (transformers', torchtitan's, llm-foundry's
// MPT); the executor's and Megatron-core's fused kernels as their element-wise passes
// (documents/workload.hpp, the passes calibrate times) in the compute dtype. A compiled block's
// forward is block_traffic's, not the sum of these rows.
struct UnitOp {
  const char* op;
  Traffic moved;
  OpSpread spread = OpSpread::heads;
  bool closes = false;
};
std::vector<UnitOp> unit_ops(const documents::ModelSpec& m, const documents::TrainingJob& j,
                             const Forward& f, documents::UnitKind unit);

// A unit's ops summed: the block's (under compile, its forward the compiled kernels'), the
// head's (final norm, projection's casts, loss), the embeddings'; and those of one spread.
Traffic unit_traffic(const documents::ModelSpec& m, const documents::TrainingJob& j,
                     const Forward& f, documents::UnitKind unit);
Traffic unit_traffic(const documents::ModelSpec& m, const documents::TrainingJob& j,
                     const Forward& f, documents::UnitKind unit, OpSpread spread);
Traffic block_traffic(const documents::ModelSpec& m, const documents::TrainingJob& j,
                      const Forward& f);
Traffic head_traffic(const documents::ModelSpec& m, const documents::TrainingJob& j,
                     const Forward& f);
Traffic embedding_traffic(const documents::ModelSpec& m, const documents::TrainingJob& j,
                          const Forward& f);
// What a checkpointed block's backward reruns of its forward (forward and forward_ops).
Traffic recompute_traffic(const documents::ModelSpec& m, const documents::TrainingJob& j,
                          const Forward& f);

}  // namespace shardplan::costmodel
