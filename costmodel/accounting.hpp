// Per-unit accounting: bytes of model state per parameter for a precision policy and flavour,
// optimizer-state elements, forward FLOPs, and activation bytes for a micro-batch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "documents/job.hpp"
#include "documents/model.hpp"
#include "documents/sharding.hpp"
#include "documents/state_bytes.hpp"

namespace shardplan::costmodel {

// `framework`: what the flavour really keeps (its buffers, copies and partitions, each cited where
// sharding.hpp and the simulator model it); `zero_paper`: Rajbhandari et al. 2020
// §3, 2 + 2 + K bytes per parameter with K = 12 (fp32 master 4, momentum 4, variance 4).
enum class Accounting { framework, zero_paper };

// Bytes per parameter element of each model state (documents/state_bytes.hpp under `framework`).
documents::StateBytes state_bytes(documents::Precision p, const documents::ShardingSpec& spec,
                                  Accounting a);

// Elements of optimizer state for a unit: Adam/AdamW 2 per parameter; SGD with momentum 1;
// Adafactor (Shazeer & Stern 2018, default beta1=None) a row and a column vector per matrix and
// one element per vector parameter.
std::int64_t optimizer_state_elements(const documents::UnitTensors& u, documents::Optimizer o);

// Elements of a unit that never get sharded: tensors below the persistence threshold (ZeRO-3's
// stage3_param_persistence_threshold).
std::int64_t persistent_elements(const documents::UnitTensors& u, std::int64_t threshold);
// The executor's rule (executor/shard_layout.hpp): a unit stays whole only when every tensor of
// it is below the threshold; then all its elements, else none.
std::int64_t persistent_unit_elements(const documents::UnitTensors& u, std::int64_t threshold);

// Of the block's forward FLOPs, what torchtitan's op-level selective checkpointing reruns: its
// policy (torchtitan/distributed/activation_checkpoint.py, SelectiveAC) saves the attention
// output and every other matmul's, so the output projection and the MLP's up projection run again
// (the element-wise ops' time is not counted here).
double selective_op_recompute_flops_per_token(const documents::ModelSpec& m);

struct ActivationBytes {
  double saved = 0;      // kept from forward to backward, per unit
  double forward = 0;    // extra alive during the unit's forward only (the loss's fp32 copy)
  double recompute = 0;  // extra alive while a checkpointed unit's backward reruns its forward
  double backward = 0;   // transient during the unit's backward (e.g. the logits gradient)
  double loss = 0;       // of `saved`, what the loss's own backward releases (head only), before
                         // the projection's gradients exist
  // Blocks: what the MLP's backward holds beyond the block's saved tensors at its largest, when
  // of the block's weights only the down projection has its gradient (mlp_backward_transient).
  double mlp_backward = 0;
  // Blocks: of what the backward holds from the forward (saved, or rebuilt by the recompute),
  // what the MLP and the norm before it keep; released once their backward has run, before the
  // attention's weights have their gradients (0: not known to run first).
  double mlp_released = 0;
  // Head under PyTorch's TP plans: the projection's backward once the loss's has released its
  // tensors (the logits' gradient and the input's), beside the head's gradients.
  double projection = 0;
};

// How the forward keeps its tensors: e bytes of the compute dtype; p bytes of the parameters it
// reads (4 under autocast, where each GEMM casts its inputs; e where FSDP or DeepSpeed hand over
// 16-bit parameters); cuda: it runs CUDA's kernels (torch's _fused_rms_norm keeps its input and
// rstd, CUDA's dropout a 1-byte mask; on a CPU F.rms_norm runs as ops that keep fp32 copies).
struct Forward {
  double e = 2;
  double p = 2;
  bool cuda = true;
};

// What one transformer block keeps for backward under the job's recipe (its model code),
// precision (e: bytes of the compute dtype), attention and checkpointing mode, per micro-batch.
// `checkpointed`: this block runs under full checkpointing (full, or its turn under every:N).
// The recipe's block table (block_table.hpp) at t = 1: each row derived per saved tensor from its
// model code, cited beside it, and checked against the bytes PyTorch's autograd saves
// (tests/costmodel/data/oracle_units.json).
ActivationBytes block_activations(const documents::ModelSpec& m, const documents::TrainingJob& job,
                                  const Forward& f, bool checkpointed);
// Why an MPT model (llm-foundry's MPTForCausalLM) cannot be planned with this job, or "": its code
// runs under the llm-foundry recipe, and the block is modeled (block_table.cpp, mpt_rows) for
// low_precision_layernorm or low_precision_rmsnorm, either FFN, multi-head, grouped or
// multi-query attention, qk_ln and qk_gn (under the LayerNorm), clip_qkv, learned positions,
// ALiBi, rope (hf measured, dail derived) or none, dropout, without a sliding window
// (documents/model_mpt.cpp, ModelSpec::unmeasured).
std::string mpt_unmodeled(const documents::ModelSpec& m, const documents::TrainingJob& job);

// The executor's own model code (Recipe::executor, executor/gpt_model.hpp and, with t > 1,
// executor/tensor_parallel_block.cpp and tensor_parallel_vocab.cpp, and with c > 1
// executor/context_parallel_block.cpp) on one rank of a stage. N = s·b/c tokens per micro-batch
// (the rank's share of its sequences); n = N/t under sequence parallelism, else N (the hidden
// states between units and the norms run on n tokens). It has no dropout, keeps each norm's fp32
// statistics (rstd, and the mean for LayerNorm) per token of n, and per block: its input, the
// norms' outputs and (sequential residual) the attention's residual sum [n, h]; q, k, v and the
// projection's input [N, (q + 2kv)/t + q/t]; the MLP's [N, I/t] tensors (2, SwiGLU 3); the
// attention core of its a/t heads. On the last stage the head keeps its input [n, h], its normed
// input gathered whole [N, h], the logits [N, V/t] in the compute dtype beside their fp32
// log-probabilities (not Megatron's in-place softmax), and the targets beside the tokens.
// Transients beyond what is saved:
//   a block's backward, in its MLP part: the incoming gradient dy [n, h], the MLP input's gradient
//     [N, h] (and the normed input gathered again [N, h] under sequence parallelism), d_act,
//     d_pre (and SwiGLU's d_up) [N, I/t] in place of the freed MLP output
//   the head's backward: t = 1, the two [N, V] gradients of the loss (fp32 log-probabilities',
//     the logits' in e); t > 1, the vocabulary-parallel cross-entropy's one gradient of the
//     logits [N, V/t] in e (softmax − one-hot), then the normed input's gradient [N, h] once the
//     logits and log-probabilities are freed
//   with context parallelism, the attention core's backward in ring attention: the block's MLP
//     tensors and norm2's output (and the residual sum) are freed by then; alive beside the rest
//     of the block's saved tensors: dy [n, h], the projection input's gradient [N, q/t], dq, dk,
//     dv [N, (q + 2kv)/t], delta (fp32 per head and token) and the ring's keys and values
//     received, the dK and dV arriving [N, kv/t] ×3 (executor/context_parallel_block.cpp). The
//     forward's ring (an fp32 output [N, q/t] and up to three [N, kv/t]) is not counted: per
//     token it is 4q/t + 3e·kv/t, below what the block's MLP backward holds beyond the forward's
//     moment (the rest of the block's saved tensors, e·(q/t + 2h + 3I/t), and its transient
//     2e·h) when q, kv ≤ h ≤ I; the tests' model with I < h peaks at the backward's ring
// Bytes per micro-batch, e of the compute dtype. (What a block keeps is its table:
// block_table.hpp.)
struct ExecutorTensors {
  double norm_stats = 0;       // one norm's fp32 statistics: rstd, and the mean for LayerNorm
  double block_transient = 0;  // what a block's backward's MLP part holds beyond its saved tensors
  double head = 0;             // what the head keeps, its norm's statistics with it
  double head_transient = 0;   // what the head's backward holds beyond that
};
ExecutorTensors executor_tensors(const documents::ModelSpec& m, double e, double T, double t,
                                 bool sequence_parallel);

// The embeddings: what their backward needs (the token ids) and what the recipe computes once
// for all blocks (rotary tables).
ActivationBytes embedding_activations(const documents::ModelSpec& m,
                                      const documents::TrainingJob& job, const Forward& f);
// transformers' rotary cos and sin tables, computed once per forward and read by every block
// (zero for recipes that keep them as a module buffer or have none).
double rotary_table_bytes(const documents::ModelSpec& m, const documents::TrainingJob& job,
                          double p);
// An attention mask built once and kept by checkpointed blocks (GPT-2's eager path, transformers'
// sliding-window mask for sdpa).
double checkpointed_mask_bytes(const documents::ModelSpec& m, const documents::TrainingJob& job,
                               double p);
// The head: the final norm, the projection to the vocabulary and the loss, by the job's loss.
ActivationBytes head_activations(const documents::ModelSpec& m, const documents::TrainingJob& job,
                                 const Forward& f);

}  // namespace shardplan::costmodel
