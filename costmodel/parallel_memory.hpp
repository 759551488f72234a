// What one rank of a tensor-parallel group holds, as the step walk (simulation.hpp) splits each
// unit, by whose tensor parallelism the recipe runs:
//   megatron, llm-foundry, deepspeed: Megatron-core's GPT (Korthikanti et al. 2022, "Reducing
//     Activation Recomputation in Large Transformer Models", §4 and Table 2): the vocabulary-
//     parallel embedding and head, the linears' inputs kept as shards under sequence
//     parallelism, the in-place vocabulary-parallel cross-entropy (layer_activations,
//     tp_local_elements).
//   hf and torchtitan: PyTorch's own parallel styles (torch/distributed/tensor/parallel/style.py)
//     as each recipe's plan applies them: transformers' tp_plan (the embeddings and norms
//     replicated, the logits gathered for the model's own loss) and torchtitan's parallelize
//     function (the row-wise embedding, whose gradient comes back whole; sequence-parallel norms
//     whose outputs the linears keep all-gathered; loss_parallel) (torch_tp_elements,
//     torch_tp_block, torch_tp_head and the backward transients).
// Async tensor parallelism's framework buffers (async_tp_bytes) are outside the caching
// allocator. And the order each recipe's pipeline runs its ops in (stage_orders), which the
// walk of a pipeline's stages follows (pipeline_walk.hpp); StageMemory is a walked stage's peak.
#pragma once

#include <string>
#include <vector>

#include "costmodel/accounting.hpp"
#include "costmodel/parallel_layout.hpp"
#include "costmodel/pipeline_schedule.hpp"
#include "documents/hardware.hpp"
#include "documents/job.hpp"
#include "documents/model.hpp"
#include "documents/parallel.hpp"
#include "documents/pipeline_order.hpp"
#include "documents/recipe.hpp"
#include "documents/sharding.hpp"

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
LayerActivations layer_activations(const documents::ModelSpec& m, const documents::TrainingJob& j,
                                   const documents::ParallelLayout& l, double e);

// Elements one rank holds of a unit under tensor parallelism: matrices split by t (column- and
// row-parallel linears, the vocabulary-parallel embedding and head) and the column-parallel
// linears' biases with them; other vectors (norms, row-parallel biases) whole. GPT-2's learned
// position table stays whole (Megatron keeps position embeddings replicated).
double tp_local_elements(const documents::UnitTensors& u, int t, bool embedding);

// What one block keeps per micro-batch on one rank under PyTorch's tensor-parallel styles as hf's
// and torchtitan's plans apply them (the parts between the column- and row-parallel linears split
// by t, the norms' by sequence parallelism, torchtitan's op-level save list on the local tensors),
// as parallel_memory counts every block of a stage; `checkpointed`: under full checkpointing.
ActivationBytes torch_tp_block(const struct ParallelMemoryInput& in, bool checkpointed);
// The head's on one rank under those plans: the final norm, the projection's input and the loss
// (torchtitan's vocabulary-parallel cross-entropy keeps its fp32 log-probabilities [T, V/t]).
ActivationBytes torch_tp_head(const struct ParallelMemoryInput& in);

// Elements of a unit on one rank before data-parallel sharding.
struct UnitElements {
  double params = 0;
  double grads = 0;      // the gradient one rank holds (PyTorch's row-wise embedding: whole)
  double optimizer = 0;  // optimizer-state elements
  double plain = 0;      // of params: plain tensors beside the plan's DTensors
};
// A unit on one rank under PyTorch's TP plans as the recipe's row applies them (`style`: how the
// plan treats the token embedding; `embedding`: the unit is the embeddings).
UnitElements torch_tp_elements(const documents::UnitTensors& u, documents::Optimizer o,
                               const documents::ParallelLayout& l, documents::TpEmbedding style,
                               bool embedding);
// The head's projection backward on one rank under those plans, beyond what the units keep: the
// logits' gradient and its input's, the loss's own tensors released.
double torch_tp_projection_backward(const struct ParallelMemoryInput& in);
// Async tensor parallelism's communication buffers on one rank (its framework's).
double async_tp_bytes(const struct ParallelMemoryInput& in);

struct StageMemory {
  int stage = 0;
  double blocks = 0;        // transformer blocks on the stage (all its chunks)
  double local_params = 0;  // elements this rank holds before data-parallel sharding
  double param_bytes = 0, grad_bytes = 0, optimizer_bytes = 0;
  double buffer_bytes = 0;      // gathered parameters, unsharded gradients, CP's K/V buffers
  double activation_bytes = 0;  // saved for the in-flight micro-batches plus the transients
  double in_flight = 0;         // micro-batches of the whole stage held at once (the walk's)
  double overhead_bytes = 0;    // CUDA context, NCCL workspace, fragmentation
  // The walk's moment of the stage's peak ("optimizer step", "backward of block 3 (last
  // micro-batch)"); empty for a one-stage layout, whose summary names it.
  std::string moment;
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
  const documents::ModelSpec* model = nullptr;
  const documents::HardwareProfile* hardware = nullptr;
  documents::Cluster cluster;
  documents::TrainingJob job;  // micro_batch > 0
  documents::ShardingSpec spec;
  documents::ParallelLayout layout;
};

// Each stage's op order as the recipe's pipeline runs it: torch.distributed.pipelining's
// (torch_interleaved_ops) for torchtitan's interleaved stages, Megatron's (schedule_ops)
// otherwise. The step's time walk and its memory follow this one order.
std::vector<std::vector<documents::PipeOp>> stage_orders(const ParallelMemoryInput& in);

// Stage s's compute order under torch.distributed.pipelining's ScheduleInterleaved1F1B with p
// stages, v chunks each and m micro-batches (what torchtitan's pipeline runs with v > 1; the
// model's chunk k of stage s is virtual stage k·p + s). Megatron's order is schedule_ops'.
std::vector<documents::PipeOp> torch_interleaved_ops(int p, int s, int v, int m);

}  // namespace shardplan::costmodel
