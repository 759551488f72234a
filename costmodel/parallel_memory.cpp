// Over 800 lines: the analytic memory model of tensor- and pipeline-parallel stages, one part per
// tensor-parallel implementation (Megatron-core's, PyTorch's styles, the executor's) and torch's
// pipeline moments. The step's event walk (simulator.cpp), which already runs context
// parallelism, is to take these layouts over; until then the model stays whole in one place.
#include "costmodel/parallel_memory.hpp"
#include "documents/hardware.hpp"
#include "documents/job.hpp"
#include "documents/model.hpp"
#include "documents/parallel.hpp"
#include "documents/pipeline_order.hpp"
#include "documents/recipe.hpp"
#include "documents/sharding.hpp"
#include "documents/state_bytes.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace shardplan::costmodel {

using documents::AsyncTp;
using documents::AttentionImpl;
using documents::Checkpointing;
using documents::compute_dtype;
using documents::dtype_bytes;
using documents::Flavour;
using documents::fused_adam;
using documents::LossImpl;
using documents::MlpKind;
using documents::ModelSpec;
using documents::NormKind;
using documents::Offload;
using documents::Optimizer;
using documents::ParallelLayout;
using documents::peak_held;
using documents::pipeline_parts;
using documents::PipelineRunner;
using documents::PipeOp;
using documents::PipeOpKind;
using documents::recipe_traits;
using documents::RecipeTraits;
using documents::schedule_ops;
using documents::stage_blocks;
using documents::stage_first_block;
using documents::state_bytes;
using documents::StateBytes;
using documents::TensorParallelCode;
using documents::TpEmbedding;
using documents::TpLoss;
using documents::TrainingJob;
using documents::UnitTensors;

// Korthikanti et al. 2022, §4.1, count per layer with s·b tokens (Table 2 sums them):
//   attention: the QKV input 2sbh; Q and K for QKᵀ 4sbh; softmax output 2as²b, its dropout mask
//   as²b and the dropped probabilities 2as²b; V 2sbh; the output projection's input 2sbh; the
//   residual dropout mask sbh                                          = 11sbh + 5as²b
//   MLP: the first linear's input 2sbh, GELU's input 8sbh, the second linear's input 8sbh, the
//   dropout mask sbh                                                   = 19sbh
//   two LayerNorm inputs                                               = 4sbh
// Tensor parallelism splits what lies between the column- and row-parallel linears (Q, K, V, the
// core, the projection input, GELU's input and output: 24sbh + 5as²b) and leaves the rest whole on
// every rank (the norm inputs, the linears' inputs, the masks: 10sbh): sbh·(10 + 24/t + 5as/(ht)).
// Sequence parallelism splits the 10sbh over the sequence too: sbh/t·(34 + 5as/h).
// The same tensors for any shapes, with e bytes per element and T = s·b/c local tokens (context
// parallelism splits the sequence):
//   outside: norm inputs 2·e·T·h (one with GPT-NeoX's parallel residual), the QKV and MLP
//            inputs 2·e·T·h, residual dropout masks 2·T·h (1 byte each, when the model has them)
//   inside:  Q, K, V e·T·(q + 2·kv) — grouped-query attention keeps kv = kv_heads·head_dim wide K
//            and V; the projection input e·T·q; the MLP: GELU 2·e·T·I (its input and output),
//            SwiGLU 3·e·T·I (the fused swiglu's input, gate and up side by side, 2·e·T·I, and the
//            down projection's input e·T·I: megatron/core/fusions/fused_bias_swiglu.py)
//   core:    eager e·a·s·T for the softmax output, plus (1 + e)·a·s·T with attention dropout;
//            flash attention keeps one fp32 log-sum-exp per head and token, 4·a·T
// With GPT-3's shapes (q = kv = h, I = 4h, dropout, eager) this is the paper's formula exactly.
LayerActivations layer_activations(const ModelSpec& m, const TrainingJob& j,
                                   const ParallelLayout& l, double e) {
  const double t = l.tensor_parallel;
  const double c = l.context_parallel;
  const double T = static_cast<double>(j.seq_len) / c * static_cast<double>(j.micro_batch);
  const double s = static_cast<double>(j.seq_len);
  const double h = static_cast<double>(m.hidden), q = static_cast<double>(m.q_width());
  const double kv = static_cast<double>(m.kv_width()), a = static_cast<double>(m.heads);
  const double I = static_cast<double>(m.intermediate);
  LayerActivations out;
  out.outside = (m.parallel_residual ? 1.0 : 2.0) * e * T * h + 2 * e * T * h;
  if (m.residual_dropout) out.outside += 2 * T * h;
  if (l.sequence_parallel) out.outside /= t;
  double core = 4 * a * T;
  if (j.attention == AttentionImpl::eager) {
    core = e * a * s * T;
    if (m.attention_dropout) core += (1 + e) * a * s * T;
  }
  const double mlp = (m.mlp == MlpKind::gelu ? 2.0 : 3.0) * e * T * I;
  out.core = core / t;
  out.inside = (e * T * (q + 2 * kv) + e * T * q + mlp) / t + out.core;
  return out;
}

namespace {

// A column-parallel linear's bias, by the Hugging Face module names of the linears Megatron makes
// ColumnParallelLinear (their output features split, and with them the bias:
// megatron/core/tensor_parallel/layers.py, ColumnParallelLinear, bias of
// output_size_per_partition): the query, key and value projections, fused or not, and the MLP's
// up and gate projections.
bool column_parallel_bias(const std::string& name) {
  if (!name.ends_with(".bias")) return false;
  for (const char* module :
       {"q_proj.", "k_proj.", "v_proj.", "c_attn.", "query_key_value.", "qkv_proj.", "W_pack.",
        "gate_proj.", "up_proj.", "gate_up_proj.", "c_fc.", "dense_h_to_4h.", "fc1."})
    if (name.find(module) != std::string::npos) return true;
  return false;
}

}  // namespace

double tp_local_elements(const UnitTensors& u, int t, bool embedding) {
  double n = 0;
  for (std::size_t i = 0; i < u.tensors.size(); ++i) {
    const auto& x = u.tensors[i];
    const bool split = x.is_matrix() ? !(embedding && i > 0)  // of the embeddings, the token table
                                     : column_parallel_bias(x.name);
    n += static_cast<double>(x.elements()) / (split ? t : 1);
  }
  return n;
}

namespace {

// The stage's share of the model: blocks, and whether it holds the embeddings and the head.
struct StageShare {
  double blocks = 0;
  bool first = false, last = false;
  const std::vector<PipeOp>* ops = nullptr;  // the stage's op order, with model chunks (v > 1)
  int index = 0;                             // the stage's place in the pipeline, 0 .. p − 1
  std::vector<double> chunks{};  // blocks of each of its v chunks (documents::pipeline_parts)
};

// The saved activations a stage holds at once. With one model chunk per stage: `in_flight`
// micro-batches of everything the stage keeps (blocks, plus the embedding's part on the first
// stage and the head's on the last). With v chunks (the interleaved schedule) the chunks differ:
// chunk 0 of the first stage has the embedding's part, chunk v − 1 of the last stage the head's,
// each chunk its part of the blocks; walked in the stage's own order, a forward keeping its chunk's
// bytes until the backward of the same micro-batch and chunk.
double held_bytes(const ParallelLayout& l, const StageShare& share, double blocks,
                  double first_extra, double last_extra, double in_flight) {
  const double first = share.first ? first_extra : 0, last = share.last ? last_extra : 0;
  if (share.ops == nullptr) return (blocks + first + last) * in_flight;  // one chunk per stage
  const int v = l.virtual_stages;
  // `blocks`: the bytes of the stage's blocks, shared out as its chunks' blocks are.
  std::vector<double> chunk(static_cast<std::size_t>(v), blocks / v);
  if (share.chunks.size() == chunk.size() && share.blocks > 0)
    for (std::size_t k = 0; k < chunk.size(); ++k)
      chunk[k] = blocks * share.chunks[k] / share.blocks;
  chunk.front() += first;
  chunk.back() += last;
  return peak_held(*share.ops, chunk);
}

// PyTorch's own parallelism rather than Megatron's, without context parallelism: a recipe whose
// TP is torch's styles (RecipeTraits::tensor_parallel: the parallel styles of
// torch/distributed/tensor/parallel/style.py applied by the recipe's plan) with t > 1, and one
// whose stages torch.distributed.pipelining runs, with a pipeline (whatever t).
bool pytorch_tp(const ParallelMemoryInput& in) {
  const RecipeTraits& r = recipe_traits(in.job.recipe);
  const bool plan =
      r.tensor_parallel == TensorParallelCode::torch_styles && in.layout.tensor_parallel > 1;
  const bool piped =
      r.pipeline == PipelineRunner::torch_pipelining && in.layout.pipeline_parallel > 1;
  return (plan || piped) && in.layout.context_parallel == 1;
}

}  // namespace

// A unit under PyTorch's TP plans. Vectors (norms, biases) stay whole, as tp_local_elements
// counts them.
//   hf          transformers' tp_plan (LlamaConfig.base_model_tp_plan in
//               transformers/models/llama/configuration_llama.py, LlamaForCausalLM._tp_plan in
//               modeling_llama.py): q/k/v and gate/up "colwise", o and down "rowwise", lm_head
//               "colwise_rep". The embeddings and the norms are in no plan: replicated plain
//               tensors, their gradients and optimizer states whole on every rank.
//   torchtitan  its parallelize function (torchtitan/models/llama3/infra/parallelize.py,
//               apply_tp): tok_embeddings RowwiseParallel (the table split by rows), the norms
//               SequenceParallel (replicated DTensors; plain tensors without sequence
//               parallelism), the linears colwise/rowwise, the output ColwiseParallel. The
//               row-wise table's gradient comes back whole: aten.embedding_dense_backward has no
//               strategy with a Shard(0) output (torch/distributed/tensor/_ops/
//               _embedding_ops.py, embedding_dense_backward_strategy: Replicate, colwise or
//               Partial), so each rank holds a [V, h] gradient.

UnitElements torch_tp_elements(const UnitTensors& u, Optimizer o, const ParallelLayout& l,
                               TpEmbedding style, bool embedding) {
  const double t = l.tensor_parallel;
  UnitElements out;
  for (std::size_t i = 0; i < u.tensors.size(); ++i) {
    const auto& x = u.tensors[i];
    const double whole = static_cast<double>(x.elements());
    const bool table = embedding && i == 0;
    const bool split = x.is_matrix() && (!embedding || (table && style == TpEmbedding::rowwise));
    out.params += whole / (split ? t : 1);
    out.grads += table ? whole : whole / (split ? t : 1);
    // t = 1: no DTensor at all, every parameter a plain tensor of one foreach group.
    const bool plain =
        t == 1 ||
        (style == TpEmbedding::unplanned ? !split : !x.is_matrix() && !l.sequence_parallel);
    if (plain) out.plain += whole;
  }
  out.optimizer = static_cast<double>(optimizer_state_elements(u, o)) * out.params /
                  std::max<double>(1, static_cast<double>(u.params()));
  return out;
}

namespace {

// A unit under Megatron's split (tp_local_elements).
UnitElements megatron_elements(const UnitTensors& u, Optimizer o, int t, bool embedding) {
  UnitElements out;
  out.params = out.grads = tp_local_elements(u, t, embedding);
  out.optimizer = static_cast<double>(optimizer_state_elements(u, o)) * out.params /
                  std::max<double>(1, static_cast<double>(u.params()));
  return out;
}

// The stage's elements on one rank: its blocks, the embeddings on the first stage, the head on
// the last.
UnitElements stage_elements(const ParallelMemoryInput& in, const StageShare& share) {
  const auto& m = *in.model;
  const Optimizer o = in.job.optimizer;
  const bool plan = pytorch_tp(in);
  auto unit = [&](const UnitTensors& u, bool embedding) {
    return plan ? torch_tp_elements(u, o, in.layout, recipe_traits(in.job.recipe).tp_embedding,
                                    embedding)
                : megatron_elements(u, o, in.layout.tensor_parallel, embedding);
  };
  UnitElements out;
  auto add = [&](const UnitElements& u, double count) {
    out.params += count * u.params;
    out.grads += count * u.grads;
    out.optimizer += count * u.optimizer;
    out.plain += count * u.plain;
  };
  add(unit(m.block, false), share.blocks);
  if (share.first) add(unit(m.embedding, true), 1);
  if (share.last) add(unit(m.head, false), 1);
  // Tied embeddings across stages: the last stage keeps its own copy of the word embeddings for
  // the output layer and the two copies' gradients are all-reduced (Megatron-core's
  // LanguageModule.setup_embeddings_and_output_layer, shared_embedding_or_output_weight).
  if (share.last && m.tied_embeddings && !m.embedding.tensors.empty() &&
      in.layout.pipeline_parallel > 1) {
    UnitTensors word;
    word.tensors.push_back(m.embedding.tensors.front());
    // The executor's copy is its whole embedding unit, a learned position table too
    // (executor/pipeline.hpp).
    add(unit(recipe_traits(in.job.recipe).framework ? word : m.embedding, true), 1);
  }
  return out;
}

// The ranks a sharded state is split over: the spec's group within the d·c data- and
// context-parallel ranks at one tensor-parallel position (LayoutGroups::data_context;
// Megatron-core's distributed optimizer shards over its dp-cp group, torchtitan's FSDP over
// dp_shard_cp).
double shard_ranks(const ParallelMemoryInput& in) {
  const int dc = std::max(1, in.layout.data_parallel(in.cluster.gpus)) * in.layout.context_parallel;
  return std::min(in.spec.group(dc), dc);
}

// Model states of one stage on one rank: split by t, sharded over the data- and context-parallel
// ranks.
void stage_states(const ParallelMemoryInput& in, const StageShare& share, StageMemory& out) {
  const auto& m = *in.model;
  const auto& s = in.spec;
  const int t = in.layout.tensor_parallel;
  const StateBytes sb = state_bytes(in.job.precision, s, Accounting::framework);
  const int d = std::max(1, in.layout.data_parallel(in.cluster.gpus));
  const double S = shard_ranks(in);
  const UnitElements local = stage_elements(in, share);
  const double elems = local.params;
  out.local_params = elems;
  out.param_bytes = elems * sb.param / (s.shard_parameters ? S : 1);
  out.grad_bytes = local.grads * sb.grad / (s.shard_gradients ? S : 1);
  out.optimizer_bytes =
      (sb.master * elems + sb.moment * local.optimizer) / (s.shard_optimizer ? S : 1);
  // torch DDP's buckets hold a second copy of the whole gradients (gradient_as_bucket_view=False),
  // as the simulator counts them (costmodel/simulator.cpp, grad_bucket_copy). PyTorch's TP
  // recipes wrap the model in DDP only over a data-parallel group: torchtitan's parallelize calls
  // apply_ddp only when the replicate degree is above 1, and transformers' tp_plan wraps nothing.
  if (s.grad_bucket_copy && (d > 1 || !pytorch_tp(in))) out.buffer_bytes += elems * sb.grad;
  // Sharded parameters are gathered in the compute dtype. With a pipeline, torchtitan keeps the
  // stage's parameters gathered from forward to backward (its "default" reshard_after_forward
  // policy is False when pipeline parallelism is on:
  // torchtitan/models/llama3/infra/parallelize.py); without one, FSDP holds the unit in use and the
  // prefetched one.
  const double block_local = tp_local_elements(m.block, t, false);
  if (s.shard_parameters)
    out.buffer_bytes +=
        in.layout.pipeline_parallel > 1 ? elems * sb.compute : 2 * block_local * sb.compute;
  // Sharded gradients: one unit's unsharded gradient lives until it is reduce-scattered. Under a
  // pipeline the stage runs its micro-batches without gradient sync (torch/distributed/pipelining/
  // stage.py, backward_maybe_with_nosync: set_requires_gradient_sync(False) until the last), so
  // the whole stage's unsharded gradients accumulate until the last micro-batch's reduction.
  if (s.shard_gradients)
    out.buffer_bytes += (in.layout.pipeline_parallel > 1 ? elems : block_local) * sb.compute;
}

// What the head keeps on the last stage per micro-batch (Megatron-core GPT): the final norm's
// input, the output layer's input (split by t under sequence parallelism) and the vocabulary-
// parallel cross-entropy's fp32 softmax, computed in place over the logits (split by t:
// megatron/core/tensor_parallel/cross_entropy.py).
double head_saved(const ModelSpec& m, const TrainingJob& j, const ParallelLayout& l, double e) {
  const double t = l.tensor_parallel;
  const double T =
      static_cast<double>(j.seq_len) / l.context_parallel * static_cast<double>(j.micro_batch);
  const double sp = l.sequence_parallel ? t : 1.0;
  return 2 * e * T * static_cast<double>(m.hidden) / sp + 4 * T * static_cast<double>(m.vocab) / t;
}

// The embeddings on the first stage per micro-batch: the token ids (int64, the lookup's backward)
// and, with embedding dropout, its 1-byte mask (split by t under sequence parallelism).
double embedding_saved(const ModelSpec& m, const TrainingJob& j, const ParallelLayout& l) {
  const double T =
      static_cast<double>(j.seq_len) / l.context_parallel * static_cast<double>(j.micro_batch);
  const double mask = m.embedding_dropout ? T * static_cast<double>(m.hidden) : 0;
  return 8 * T + mask / (l.sequence_parallel ? l.tensor_parallel : 1);
}

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
struct ExecutorStage {
  double saved = 0, transient = 0;
  // Of `saved`, what only the first stage's first chunk or the last stage's last chunk keeps.
  double first_extra = 0, last_extra = 0;
  // The parts of `saved` and `transient` the head's and the blocks' moments are made of.
  double head_saved = 0, head_transient = 0, block_transient = 0;
};
ExecutorStage executor_stage(const ModelSpec& m, const TrainingJob& j, const ParallelLayout& l,
                             const StageShare& share, int first_block, double e) {
  const double t = l.tensor_parallel;
  const double T =
      static_cast<double>(j.seq_len) / l.context_parallel * static_cast<double>(j.micro_batch);
  const double n = T / (l.sequence_parallel ? t : 1.0);
  const double h = static_cast<double>(m.hidden);
  const double q = static_cast<double>(m.q_width()), kv = static_cast<double>(m.kv_width());
  const double I = static_cast<double>(m.intermediate), a = static_cast<double>(m.heads);
  const ExecutorTensors x = executor_tensors(m, j, e, T, t, l.sequence_parallel);
  const double stats = x.norm_stats, block = x.block;
  const double mlp_width = m.mlp == MlpKind::gelu ? 2.0 : 3.0;
  ExecutorStage out;
  bool any_full = false;
  for (std::int64_t b = 0; b < static_cast<std::int64_t>(share.blocks); ++b) {
    const bool cp = j.block_checkpointed(first_block + b);
    any_full |= cp;
    const double kept = cp ? e * n * h : block;
    out.saved += kept;
  }
  if (share.blocks > 0) {
    out.block_transient = x.block_transient;
    if (l.context_parallel > 1) {
      const double ring =
          e * n * h + e * T * (2 * q + 5 * kv) / t + 4 * a * T / t -
          (mlp_width * e * T * I / t + e * n * h * (m.parallel_residual ? 1 : 2) + stats);
      out.block_transient = std::max(out.block_transient, ring);
    }
    if (any_full) out.block_transient += block;
  }
  out.transient = out.block_transient;
  if (share.first || share.last) out.saved += 8 * T;  // int32 tokens and targets
  if (share.first) out.first_extra = 8 * T;
  if (share.last) {
    out.head_saved = x.head;
    out.saved += out.head_saved;
    out.last_extra = 8 * T + out.head_saved;
    out.head_transient = x.head_transient;
    // The blocks' backward runs after the head's has freed what the head kept (this micro-batch's
    // head_saved; with one chunk per stage every block of the stage comes after the head).
    const double block_after_head =
        l.virtual_stages == 1 ? out.block_transient - out.head_saved : out.block_transient;
    out.transient = std::max(block_after_head, out.head_transient);
  }
  // A stage that sends a forward on (every stage but the last; with chunks, each): its output
  // beside the tensor received for the next step.
  if (!share.last || l.virtual_stages > 1) out.transient = std::max(out.transient, 2 * e * T * h);
  return out;
}

// torchtitan's pipeline: its stages run by torch.distributed.pipelining's schedules
// (torchtitan/distributed/pipeline_parallel.py builds PipelineStage and the schedule).
bool piped_stage(const ParallelMemoryInput& in) {
  return recipe_traits(in.job.recipe).pipeline == PipelineRunner::torch_pipelining &&
         in.layout.pipeline_parallel > 1;
}

// What one rank of a stage keeps per micro-batch under PyTorch's TP styles, in bytes.
struct PlanActivations {
  double saved = 0;          // the stage's blocks, embeddings (first stage) and head (last stage)
  double head = 0;           // of `saved`, the head's, released by its backward
  double recompute = 0;      // one checkpointed block rebuilt in backward (0 without checkpoints)
  double loss_backward = 0;  // the loss's backward transients (last stage)
  double loss_released = 0;  // of `head`, what the loss's backward releases (its log-probabilities)
  double embedding = 0;      // of `saved`, the embedding's (first stage): the ids it keeps
  double later_blocks = 0;   // of `saved`, the blocks' after the stage's first
  // Under a pipeline (PyTorch's pipelining), of `saved`: the last stage's output, the logits,
  // which the stage keeps until the micro-batch's backward ends (torch/distributed/pipelining/
  // stage.py: _output_slot_is_releasable refuses the last stage's output, forward_one_chunk keeps
  // it in _forward_chunk_states, backward_one_chunk detaches it after the backward).
  double kept_output = 0;
  double head_backward = 0;   // the projection's backward: the logits' gradient and its input's
  double block_backward = 0;  // a block's MLP backward: its gradients less what it releases
};

// The forward's dtypes (accounting.hpp, Forward): e bytes of the compute dtype; p of the
// parameters the blocks read (fp32 under DDP's autocast and FSDP's fp32_gathered, e when FSDP
// hands them over in the compute dtype).
Forward plan_forward(const ParallelMemoryInput& in) {
  const double e = dtype_bytes(compute_dtype(in.job.precision));
  const StateBytes sb = state_bytes(in.job.precision, in.spec, Accounting::framework);
  const bool gathered_16 = in.spec.shard_parameters && !in.spec.fp32_gathered;
  return {e, gathered_16 ? e : std::max(e, sb.param), !in.hardware->is_cpu};
}

// One block on one rank, saved and (checkpointed) rebuilt. The column-parallel q/k/v and gate/up
// and the row-parallel o and down (torch/distributed/tensor/parallel/style.py) split everything
// between them over the heads and the intermediate width (BlockParts::inside / t): each rank
// runs the block's own code on a/t heads and I/t columns. The norms run on every token, or under
// sequence parallelism (SequenceParallel) on the rank's T/t of them (BlockParts::residual / t);
// their outputs, which the column-parallel linears keep, are whole either way: replicated, or
// all-gathered by PrepareModuleInput (Shard(1) -> Replicate) before the linears, which keep the
// gathered tensor (unlike Megatron, which keeps its shard and gathers again in backward).
// A checkpointed block keeps its input, the rank's share of the residual stream.
ActivationBytes plan_block(const ParallelMemoryInput& in, const Forward& f, bool checkpointed) {
  const auto& m = *in.model;
  const auto& j = in.job;
  const double t = in.layout.tensor_parallel;
  const double sp = in.layout.sequence_parallel ? t : 1.0;
  const BlockParts parts = framework_block_parts(m, j, f);
  const double full = parts.residual / sp + parts.linear_inputs + parts.inside / t;
  const double T = static_cast<double>(j.seq_len) * static_cast<double>(j.micro_batch);
  ActivationBytes out;
  if (checkpointed) {
    out.saved = f.p * T * static_cast<double>(m.hidden) / sp;
    out.recompute = full;
  } else if (j.checkpointing == Checkpointing::selective_op) {
    // torchtitan's op-level save list on the rank's local tensors (selective_op_saved); the rest
    // of the rank's block is rebuilt beside it in backward.
    out.saved = selective_op_saved(m, j, f, t, sp);
    out.recompute = std::max(0.0, full - out.saved);
  } else {
    out.saved = full;
  }
  // Autocast's casts of the rank's weights, kept for backward like the activations.
  if (f.p > f.e) out.saved += f.e * static_cast<double>(m.block.matmul_params()) / t;
  return out;
}

}  // namespace

ActivationBytes torch_tp_block(const ParallelMemoryInput& in, bool checkpointed) {
  return plan_block(in, plan_forward(in), checkpointed);
}

namespace {

// The head on one rank: the final norm (its state split under sequence parallelism, the
// projection's input whole), then the loss.
//   hf          lm_head "colwise_rep" (ColwiseParallel(output_layouts=Replicate())) gathers the
//               logits, and the model's own loss runs on the whole vocabulary: the unsplit
//               head's loss terms (head_activations; the upcast loss's backward holds the two
//               fp32 [T, V] gradients at once).
//   torchtitan  ColwiseParallel(output_layouts=Shard(-1)) under loss_parallel() (torchtitan's
//               parallelize applies it unless disable_loss_parallel): the upcast loss on the
//               rank's V/t columns keeps the fp32 log-probabilities [T, V/t] and the targets; its
//               backward (torch/distributed/tensor/parallel/loss.py,
//               _nll_loss_and_log_softmax_backward: (grad_input + exp(x)) * grad_output, with
//               grad_input = zeros_like(x)) holds three fp32 [T, V/t] tensors at once. Other
//               losses: their unsplit terms over V/t columns.
ActivationBytes plan_head(const ParallelMemoryInput& in, const Forward& f) {
  const auto& j = in.job;
  const double t = in.layout.tensor_parallel;
  const double sp = in.layout.sequence_parallel ? t : 1.0;
  const NormParts norm = final_norm_parts(*in.model, j, f);
  const double T = static_cast<double>(j.seq_len) * static_cast<double>(j.micro_batch);
  ActivationBytes out;
  const bool loss_parallel = recipe_traits(j.recipe).tp_loss == TpLoss::loss_parallel;
  if (loss_parallel && j.loss == LossImpl::upcast) {
    const double V = static_cast<double>(in.model->vocab) / t;
    out.saved = 4 * T * V + 8 * T;
    // t = 1 (under a pipeline): no loss_parallel, aten's own ops: nll_loss_backward's gradient
    // (zeros, the targets' entries scattered) and _log_softmax_backward_data's result, two fp32
    // [T, V] at once beside the saved log-probabilities.
    out.backward = (t > 1 ? 3 : 2) * 4 * T * V;
    out.loss = 4 * T * V;
  } else if (loss_parallel) {
    ModelSpec columns = *in.model;
    columns.vocab = static_cast<std::int64_t>(static_cast<double>(columns.vocab) / t);
    out = head_activations(columns, j, f);
    out.saved -= norm.total();
  } else {
    out = head_activations(*in.model, j, f);
    out.saved -= norm.total();
  }
  out.saved += norm.state / sp + norm.output;
  // Autocast's cast of the rank's projection columns.
  if (f.p > f.e) out.saved += f.e * static_cast<double>(in.model->head.matmul_params()) / t;
  return out;
}

}  // namespace

ActivationBytes torch_tp_head(const ParallelMemoryInput& in) {
  return plan_head(in, plan_forward(in));
}

// The projection's backward: the logits' gradient [T, V/t] in the compute dtype and its input's
// gradient [T, h]; the loss's fp32 log-probabilities have been released.
double torch_tp_projection_backward(const ParallelMemoryInput& in) {
  const double e = plan_forward(in).e;
  const double T = static_cast<double>(in.job.seq_len) * static_cast<double>(in.job.micro_batch);
  return e * T * static_cast<double>(in.model->vocab) / in.layout.tensor_parallel +
         e * T * static_cast<double>(in.model->hidden);
}

// The MLP's backward (its element-wise part): the incoming gradient of the down projection's
// input and the gradients of its factors, [T, I/t] each (SwiGLU's three, GELU's two), once the
// down projection's saved input has been released (as executor_stage counts its block_transient).
double torch_tp_mlp_backward(const ParallelMemoryInput& in) {
  const double e = plan_forward(in).e;
  const double T = static_cast<double>(in.job.seq_len) * static_cast<double>(in.job.micro_batch);
  const double mlp_width = in.model->mlp == MlpKind::gelu ? 2.0 : 3.0;
  return (mlp_width - 1) * e * T * static_cast<double>(in.model->intermediate) /
         in.layout.tensor_parallel;
}

namespace {

PlanActivations plan_activations(const ParallelMemoryInput& in, const StageShare& share,
                                 int first_block) {
  const Forward f = plan_forward(in);
  const ActivationBytes plain = plan_block(in, f, false);
  const ActivationBytes checkpointed = plan_block(in, f, true);
  PlanActivations out;
  for (std::int64_t b = 0; b < static_cast<std::int64_t>(share.blocks); ++b) {
    const bool cp = in.job.block_checkpointed(first_block + b);
    out.saved += cp ? checkpointed.saved : plain.saved;
    if (b > 0) out.later_blocks += cp ? checkpointed.saved : plain.saved;
    out.recompute = std::max(out.recompute, cp ? checkpointed.recompute : plain.recompute);
  }
  // The token ids the lookup keeps (the masked ids of the row-wise embedding: as many) and
  // transformers' rotary tables.
  if (share.first) {
    out.embedding = embedding_activations(*in.model, in.job, f).saved;
    out.saved += out.embedding;
  }
  if (share.last) {
    const ActivationBytes head = plan_head(in, f);
    out.head = head.saved;
    out.saved += head.saved;
    out.loss_backward = head.backward;
    out.loss_released = head.loss;
  }
  const auto& m = *in.model;
  const double t = in.layout.tensor_parallel;
  const double T = static_cast<double>(in.job.seq_len) * static_cast<double>(in.job.micro_batch);
  if (share.last && piped_stage(in)) {
    out.kept_output = f.e * T * static_cast<double>(m.vocab) / t;
    out.saved += out.kept_output;
  }
  out.head_backward = torch_tp_projection_backward(in);
  out.block_backward = torch_tp_mlp_backward(in);
  return out;
}

// torch.optim.Adam/AdamW with foreach (torch/optim/adamw.py, _multi_tensor_adamw) writes
// sqrt(exp_avg_sq) of a parameter group's local tensors into new tensors (the state dtype),
// freed when the group's update ends. foreach AdamW takes no mix of DTensors and plain tensors
// in one group, so the parameters a plan leaves out (hf: the embeddings and the norms) are a
// group of their own: the larger group's intermediate is the step's peak. DeepSpeed's and
// Megatron's FusedAdam and a CPU optimizer update in place.
double foreach_temp_bytes(const ParallelMemoryInput& in, const UnitElements& local) {
  const auto& s = in.spec;
  const bool adam = in.job.optimizer == Optimizer::adam || in.job.optimizer == Optimizer::adamw;
  if (!adam || fused_adam(s.flavour) || s.offload != Offload::none) return 0;
  const double S = s.shard_optimizer ? shard_ranks(in) : 1;
  const StateBytes sb = state_bytes(in.job.precision, s, Accounting::framework);
  return std::max(local.plain, local.params - local.plain) * sb.moment / S;
}

// A moment of the step on one rank of a stage and what is alive then (plan_peak).
struct Moment {
  const char* name;
  double activations, grads, temp;
  double buffers = 0;  // FSDP2's gathered parameters and gradients on their way to the reduction
};

// The backward's moments of one stage of torchtitan's pipeline, run by torch.distributed.
// pipelining's schedules (GPipe, 1F1B; PipelineScheduleSingle.step, then the optimizer). Each
// micro-batch's backward (backward_one_chunk) runs autograd over that micro-batch only; the
// stage's gradients accumulate in .grad over the micro-batches and are divided by m in place
// after the last (scale_grads: p.grad.div_). So the step's moments are those of two backwards:
//   the first micro-batch's   the walk's in-flight micro-batches F, no gradients yet
//                             (zero_grad(set_to_none=True) freed them); its own gradients are
//                             autograd's new tensors, kept as .grad
//   a later micro-batch's     (m > 1) min(F, m − 1) in flight: the first's backward has already
//                             released its own (GPipe runs every forward, then the backwards;
//                             1F1B's steady state re-fills to F, its last backward runs alone);
//                             every gradient exists, and each new one is a tensor of the
//                             parameter's size added into .grad (AccumulateGrad,
//                             torch/csrc/autograd/functions/accumulate_grad.h: variable_grad +=
//                             new_grad): the head's, a block's down projection's or the
//                             embedding table's beside the op that produced it
// In each: the loss's backward (last stage), the projection's (last stage), a block's MLP
// backward (the first micro-batch's: the head's gradients and the down projection's exist), and
// the embedding's backward (first stage: the other micro-batches in flight, its ids, its output's
// gradient). Two tensors of a stage that is not the first live past a micro-batch's backward:
//   the input's gradient [T, h] sent to the previous stage, held until its send is waited on
//     (1F1B before the next backward's send, GPipe after the last backward): one, in a later
//     micro-batch's backward
//   the received input [T, h] of each micro-batch whose backward has ended, on the last stage:
//     the received buffer is a leaf of the micro-batch's graph, whose AccumulateGrad node keeps
//     it, and the schedule keeps each micro-batch's loss (and with it that graph) in
//     _internal_losses to the step's end and hands them to the caller's losses list, whose sum
//     torchtitan's train step (torchtitan/train.py, train_step: loss = forward_backward_step(...))
//     holds until after optimizers.step(); m − min(F, m − 1) of them in a later backward, all m
//     at the optimizer step
std::vector<Moment> pipeline_moments(const ParallelMemoryInput& in, const StageShare& share,
                                     const PlanActivations& x, double in_flight, double all_grads,
                                     double head_grads, double block_grads, double per_grad,
                                     double optimizer_temp) {
  const auto& m = *in.model;
  const double t = in.layout.tensor_parallel;
  const double e = dtype_bytes(compute_dtype(in.job.precision));
  const double T = static_cast<double>(in.job.seq_len) * static_cast<double>(in.job.micro_batch);
  const double h = static_cast<double>(m.hidden), V = static_cast<double>(m.vocab);
  const double I = static_cast<double>(m.intermediate);
  const double micro_batches = in.layout.micro_batches;
  // New gradients as AccumulateGrad receives them: the head's [V/t, h], the embedding table's
  // (whole: plan_elements), a block's down projection's [h, I/t].
  const double head_table = per_grad * V * h / t;
  const double table = per_grad * V * h;
  const double down = per_grad * I * h / t;
  const double embedding = e * T * h;  // the embedding's output gradient
  const double sp = in.layout.sequence_parallel ? t : 1.0;
  const double received = share.first ? 0 : e * T * h / sp;  // a micro-batch's input
  // The output's gradient received from the next stage (a buffer per backward, stage.py
  // get_bwd_recv_ops), held by backward_one_chunk through the micro-batch's backward.
  const double incoming = share.last ? 0 : e * T * h / sp;
  std::vector<Moment> out;
  // n micro-batches in flight; later: every gradient exists and each new one is added into it.
  auto add = [&](double n, bool later) {
    // A later micro-batch's backward: the previous one's input gradient pending, and on the last
    // stage the received inputs of the finished ones.
    const double kept = later ? received * (1 + (share.last ? micro_batches - n : 0)) : 0;
    const double saved = x.saved * n + kept + incoming;
    if (share.last) {
      out.push_back({"loss backward", saved + x.loss_backward, later ? all_grads : 0, 0});
      out.push_back({"head backward",
                     saved - x.loss_released + x.head_backward + (later ? head_table : 0),
                     later ? all_grads : head_grads, 0});
    }
    // The MLP's backward: the first micro-batch's in the stage's last block, with the head's and
    // the down projection's gradients made, and in its first, the later blocks' saved released
    // and their gradients made (the two ends: between them both change by a block at a time); a
    // later micro-batch's in the last block, at the down projection (its input's gradient
    // [T, I/t] and the new weight gradient) or at the element-wise part.
    const double block =
        later ? std::max(x.block_backward, e * T * I / t + down) : x.block_backward;
    if (share.blocks > 0)
      out.push_back({"block backward", saved - x.head + x.recompute + block,
                     later ? all_grads : head_grads + down, 0});
    if (share.blocks > 1 && !later)
      out.push_back({"block backward", saved - x.head - x.later_blocks + x.recompute + block,
                     head_grads + (share.blocks - 1) * block_grads + down, 0});
    if (share.first)
      out.push_back({"embedding backward",
                     saved - x.saved + x.embedding + embedding + (later ? table : 0), all_grads,
                     0});
  };
  add(in_flight, false);
  if (micro_batches > 1) add(std::min(in_flight, micro_batches - 1), true);
  out.push_back(
      {"optimizer step", share.last ? received * micro_batches : 0, all_grads, optimizer_temp});
  return out;
}

}  // namespace

// torch.distributed.pipelining's op order for ScheduleInterleaved1F1B on stage (rank) s of p with
// v chunks and m micro-batches (torch/distributed/pipelining/schedules.py,
// ScheduleInterleaved1F1B._calculate_single_rank_operations with _get_warmup_ops and
// _get_1f1b_rank_ops): rounds r = max(1, m / p) of m / r micro-batches each; warm-up
// min((v − 1)·m/r + 2·(p − 1 − s), m·v) forwards, then one forward one backward, then the
// backwards. The k-th forward runs local chunk (k / (m/r)) mod v, the k-th backward (counted from
// the first forward after the warm-up) chunk v − 1 − (k / (m/r)) mod v; each chunk takes its
// micro-batches in order. With m = p this differs from Megatron's order (schedule_ops), which
// runs every forward first when m = p; with m a multiple of p above p they agree.
std::vector<PipeOp> torch_interleaved_ops(int p, int s, int v, int m) {
  const int rounds = std::max(1, m / p);
  const int per_round = m / rounds;
  const int total = m * v;
  const int warmup = std::min((v - 1) * per_round + 2 * (p - 1 - s), total);
  std::vector<int> next_forward(static_cast<std::size_t>(v), 0);
  std::vector<int> next_backward(static_cast<std::size_t>(v), 0);
  std::vector<PipeOp> ops;
  auto forward = [&](int k) {
    const int chunk = (k / per_round) % v;
    ops.push_back({PipeOpKind::forward, next_forward[static_cast<std::size_t>(chunk)]++, chunk});
  };
  auto backward = [&](int k) {
    const int chunk = v - 1 - ((k - warmup) / per_round) % v;
    ops.push_back({PipeOpKind::backward, next_backward[static_cast<std::size_t>(chunk)]++, chunk});
  };
  for (int k = 0; k < warmup; ++k) forward(k);
  for (int k = warmup; k < total; ++k) {
    forward(k);
    backward(k);
  }
  for (int k = total; k < total + warmup; ++k) backward(k);
  return ops;
}

namespace {

// One model chunk of a stage (its virtual stage's blocks, the embeddings or the head with it):
// what it keeps per micro-batch, its gradients' bytes and its optimizer's foreach intermediate.
struct Chunk {
  StageShare share;
  PlanActivations x;
  double grads = 0, head_grads = 0;
  double temp = 0;  // its optimizer's foreach intermediate
};

// The stage's v chunks: chunk k is virtual stage k·p + s.
std::vector<Chunk> stage_chunks(const ParallelMemoryInput& in, const StageShare& share,
                                double per_grad) {
  const auto& l = in.layout;
  const int p = l.pipeline_parallel, v = l.virtual_stages;
  std::vector<Chunk> chunks;
  const auto parts = pipeline_parts(l, in.model->layers);
  for (int k = 0; k < v; ++k) {
    const int virtual_stage = k * p + share.index;
    const auto part = static_cast<std::size_t>(virtual_stage);
    std::int64_t first_block = 0;
    for (std::size_t i = 0; i < part; ++i) first_block += parts[i];
    Chunk c;
    c.share = StageShare{static_cast<double>(parts[part]), virtual_stage == 0,
                         virtual_stage == p * v - 1};
    c.x = plan_activations(in, c.share, static_cast<int>(first_block));
    c.grads = stage_elements(in, c.share).grads * per_grad;
    c.head_grads =
        c.share.last ? stage_elements(in, StageShare{0, false, true}).grads * per_grad : 0;
    c.temp = foreach_temp_bytes(in, stage_elements(in, c.share));
    chunks.push_back(c);
  }
  return chunks;
}

// The step's moments of one stage of torchtitan's pipeline with v > 1 model chunks per stage
// (ScheduleInterleaved1F1B, a PipelineScheduleMulti over the stage's PipelineStages; torchtitan's
// "loop" style gives chunk k of stage s virtual stage k·p + s). The stage's ops (share.ops, torch's
// order) are walked one at a time; each chunk is pipeline_moments' stage in small:
//   a forward keeps its chunk's saved tensors for that micro-batch until the same chunk's
//     backward of it (stage.py: forward_one_chunk keeps the chunk's inputs and outputs in
//     _forward_chunk_states, backward_one_chunk pops them); only virtual stage 0 has the
//     embedding, only virtual stage p·v − 1 the head, the logits and the loss
//   a backward has the moments of pipeline_moments' micro-batch backward for its chunk: the
//     chunk's first backward finds no gradient of its own (each chunk is its own module with its
//     own .grad), a later one adds into them; the other chunks' gradients exist once their
//     first backward has run
//   the runtime's sends (ScheduleInterleaved1F1B is a _PipelineScheduleRuntime: explicit SEND_F,
//     SEND_B and their waits, _add_wait_send): a non-last chunk's forward output [T, h] is sent
//     (get_fwd_send_ops keeps the tensor in the pending send) and its wait follows the same
//     chunk's backward of that micro-batch, so it lives as long as the chunk's saved tensors;
//     a non-first chunk's input gradient [T, h] (get_bwd_send_ops) is waited on at the schedule's
//     end, so every one sent so far is alive in a later backward
//   a non-first chunk's received inputs [T, h] outlive its backward of them, one per finished
//     micro-batch, to the optimizer step: on the last virtual stage the kept losses' graphs hold
//     them (pipeline_moments); the corpus shows the same on a chunk that is neither first nor
//     last, whose graph is freed (rank 0 keeps virtual stage 2's m inputs, m·T·h·4 bytes, at the
//     optimizer step: oracle_pipeline.json, pp2-interleaved-1f1b-v2-m2 and -m4 full/s128, stage
//     0); what holds those is not identified in torch's source
//   the optimizer step: torchtitan's OptimizersContainer (torchtitan/components/optimizer.py)
//     builds one optimizer per model part and steps them in turn, so the foreach intermediate is
//     the largest chunk's, not the stage's
std::vector<Moment> chunk_moments(const ParallelMemoryInput& in, const StageShare& share,
                                  double all_grads, double per_grad) {
  const auto& m = *in.model;
  const auto& l = in.layout;
  const double t = l.tensor_parallel;
  const double e = dtype_bytes(compute_dtype(in.job.precision));
  const double T = static_cast<double>(in.job.seq_len) * static_cast<double>(in.job.micro_batch);
  const double h = static_cast<double>(m.hidden), V = static_cast<double>(m.vocab);
  const double I = static_cast<double>(m.intermediate);
  const double sp = l.sequence_parallel ? t : 1.0;
  const double tensor = e * T * h / sp;  // a received input or an input's gradient [T, h]
  const double head_table = per_grad * V * h / t, table = per_grad * V * h;
  const double down = per_grad * I * h / t;
  const std::vector<Chunk> chunks = stage_chunks(in, share, per_grad);
  const double block_grads = stage_elements(in, StageShare{1, false, false}).grads * per_grad;
  const int v = l.virtual_stages;
  std::vector<Moment> out;
  std::vector<int> done(static_cast<std::size_t>(v), 0);  // backwards run per chunk
  double held = 0;  // saved bytes of the forwards whose backward has not run
  double kept = 0;  // received inputs of the finished micro-batches of non-first chunks
  double sent = 0;  // input gradients sent by earlier backwards, waited on at the end
  for (const PipeOp& op : *share.ops) {
    const auto k = static_cast<std::size_t>(op.chunk);
    const Chunk& c = chunks[k];
    const PlanActivations& x = c.x;
    const double output = c.share.last ? 0 : tensor;  // the forward's output, sent on
    if (op.kind == PipeOpKind::forward) {
      held += x.saved + output;
      continue;
    }
    const bool later = done[k] > 0;
    double others = 0;  // the other chunks' gradients made so far
    for (std::size_t j = 0; j < chunks.size(); ++j)
      if (j != k && done[j] > 0) others += chunks[j].grads;
    const double own = later ? c.grads : 0;
    const double incoming = c.share.last ? 0 : tensor;  // the output's gradient received
    const double saved = held + kept + sent + incoming;
    if (c.share.last) {
      out.push_back({"loss backward", saved + x.loss_backward, others + own, 0});
      out.push_back({"head backward",
                     saved - x.loss_released + x.head_backward + (later ? head_table : 0),
                     others + (later ? c.grads : c.head_grads), 0});
    }
    const double block =
        later ? std::max(x.block_backward, e * T * I / t + down) : x.block_backward;
    if (c.share.blocks > 0)
      out.push_back({"block backward", saved - x.head + x.recompute + block,
                     others + (later ? c.grads : c.head_grads + down), 0});
    if (c.share.blocks > 1 && !later)
      out.push_back({"block backward", saved - x.head - x.later_blocks + x.recompute + block,
                     others + c.head_grads + (c.share.blocks - 1) * block_grads + down, 0});
    if (c.share.first)
      out.push_back({"embedding backward",
                     saved - x.saved + x.embedding + e * T * h + (later ? table : 0),
                     others + c.grads, 0});
    held -= x.saved + output;
    ++done[k];
    if (!c.share.first) {
      kept += tensor;
      sent += tensor;
    }
  }
  double temp = 0;
  for (const Chunk& c : chunks) temp = std::max(temp, c.temp);
  out.push_back({"optimizer step", kept, all_grads, temp});
  return out;
}

// The step's moments on one rank of a stage under PyTorch's TP, each with what is alive then;
// the stage's memory is the largest (the categories are that moment's):
//   the loss's backward    every micro-batch in flight's saved tensors, the loss's transients;
//                          no gradients yet when this is the step's only backward
//                          (optimizer.zero_grad(set_to_none=True), torch's default, freed them)
//   a block's backward     the head's saved released, one checkpointed block rebuilt; the
//                          head's and that block's gradients (all of them when accumulating)
//   the optimizer step     every gradient, the foreach intermediate (optimizer states)
void plan_peak(const ParallelMemoryInput& in, const StageShare& share, int first_block,
               StageMemory& out) {
  const PlanActivations x = plan_activations(in, share, first_block);
  const UnitElements local = stage_elements(in, share);
  const bool fresh = in.layout.pipeline_parallel == 1 && in.layout.micro_batches <= 1;
  const double all_grads = out.grad_bytes;
  const double per_grad = all_grads / std::max(1.0, local.grads);  // bytes per element
  StageShare tail{1, false, share.last};                           // the head and the last block
  const double tail_grads = std::min(all_grads, stage_elements(in, tail).grads * per_grad);
  std::vector<Moment> moments = {{share.last ? "loss backward" : "first backward",
                                  x.saved * out.in_flight + x.loss_backward, fresh ? 0 : all_grads,
                                  0},
                                 {"block backward", x.saved * out.in_flight - x.head + x.recompute,
                                  fresh ? tail_grads : all_grads, 0}};
  const double optimizer_temp = foreach_temp_bytes(in, local);
  if (piped_stage(in)) {
    const double head_grads =
        share.last ? stage_elements(in, StageShare{0, false, true}).grads * per_grad : 0;
    const double block_grads = stage_elements(in, StageShare{1, false, false}).grads * per_grad;
    moments = share.ops != nullptr
                  ? chunk_moments(in, share, all_grads, per_grad)
                  : pipeline_moments(in, share, x, out.in_flight, all_grads, head_grads,
                                     block_grads, per_grad, optimizer_temp);
  } else {
    moments.push_back({"optimizer step", 0, all_grads, optimizer_temp});
  }
  auto bytes = [](const Moment& m) { return m.activations + m.grads + m.temp + m.buffers; };
  const Moment* best = &moments[0];
  for (const auto& m : moments)
    if (bytes(m) > bytes(*best)) best = &m;
  out.activation_bytes = best->activations;
  out.grad_bytes = best->grads;
  out.optimizer_bytes += best->temp;
  out.buffer_bytes += best->buffers;
  out.moment = best->name;
}

// Saved bytes per micro-batch of the stage's blocks (each checkpointed or not by the job's mode,
// by its place in the model), the largest transient of one of them, and the stage's extras.
void stage_activations(const ParallelMemoryInput& in, const StageShare& share, int first_block,
                       StageMemory& out) {
  if (pytorch_tp(in)) {
    plan_peak(in, share, first_block, out);
    return;
  }
  const auto& m = *in.model;
  const auto& j = in.job;
  const auto& l = in.layout;
  const double e = dtype_bytes(compute_dtype(j.precision));
  const LayerActivations layer = layer_activations(m, j, l, e);
  const double T =
      static_cast<double>(j.seq_len) / l.context_parallel * static_cast<double>(j.micro_batch);
  // A checkpointed block keeps its input: split by t under sequence parallelism (Megatron
  // checkpoints the sequence-parallel input; Korthikanti §5, 2sbh/t).
  const double input =
      e * T * static_cast<double>(m.hidden) / (l.sequence_parallel ? l.tensor_parallel : 1);
  const bool selective = j.checkpointing == Checkpointing::selective_attention;
  double saved = 0;
  bool any_checkpointed = false;
  const auto n = static_cast<std::int64_t>(share.blocks);
  for (std::int64_t b = 0; b < n; ++b) {
    const bool cp = j.block_checkpointed(first_block + b);
    any_checkpointed |= cp;
    saved += cp ? input : layer.total() - (selective ? layer.core : 0);
  }

  double transient = any_checkpointed ? layer.total() : 0;  // one block rebuilt at a time
  if (l.sequence_parallel)
    transient += e * T * static_cast<double>(m.hidden);  // the all-gathered input
  if (share.last)
    transient += e * T * static_cast<double>(m.vocab) / l.tensor_parallel;  // the logits
  out.activation_bytes =
      held_bytes(l, share, saved, embedding_saved(m, j, l), head_saved(m, j, l, e), out.in_flight) +
      transient;
  if (!recipe_traits(j.recipe).framework) {
    const ExecutorStage x = executor_stage(m, j, l, share, first_block, e);
    const double blocks =
        x.saved - (share.first ? x.first_extra : 0) - (share.last ? x.last_extra : 0);
    out.activation_bytes =
        held_bytes(l, share, blocks, x.first_extra, x.last_extra, out.in_flight) + x.transient;
  }
  // Ring attention: the K and V chunk being used and the one arriving (Transformer Engine's
  // AttnFuncWithCPAndKVP2P double-buffers them), each of the local sequence. The executor's ring
  // is counted with its block's backward above.
  if (l.context_parallel > 1 && recipe_traits(j.recipe).framework)
    out.buffer_bytes += 2 * 2 * e * T * static_cast<double>(m.kv_width()) / l.tensor_parallel;
}

}  // namespace

// Async tensor parallelism's buffers on one rank, T = s·b/c tokens per micro-batch, e bytes of
// the compute dtype; allocated at the first overlapped GEMM and kept (outside torch's caching
// allocator: device memory nvidia-smi sees, max_memory_allocated does not):
//   symmetric_memory  torch 2.15 (torch/distributed/_symmetric_memory/__init__.py):
//                     get_symm_mem_workspace keeps one workspace per group, grown to the largest
//                     request; fused_all_gather_matmul asks for the rank's shard [T/t, h],
//                     fused_matmul_reduce_scatter for two output chunks [T/t, h]
//                     (_pipelined_produce_and_all2all double-buffers them): 2·e·T·h/t
//   userbuffers       Transformer Engine 2.x (transformer_engine/pytorch/module/base.py,
//                     initialize_ub) with Megatron-LM's shape [s·b/c, h]: a communicator per
//                     overlapped GEMM (qkv, proj, fc1, fc2: 4 ring-exchange, 2 pipelined, 4 bulk
//                     and 2 external by default), each with a buffer of that shape in the compute
//                     dtype: 12·e·T·h (the three cuBLAS workspaces it keeps left out)
double async_tp_bytes(const ParallelMemoryInput& in) {
  const auto& l = in.layout;
  if (!l.async_tensor_parallel) return 0;
  const double e = dtype_bytes(compute_dtype(in.job.precision));
  const double T = static_cast<double>(in.job.seq_len) / l.context_parallel *
                   static_cast<double>(in.job.micro_batch);
  const double h = static_cast<double>(in.model->hidden);
  switch (recipe_traits(in.job.recipe).async_tp) {
  case AsyncTp::symmetric_memory:
    return 2 * e * T * h / l.tensor_parallel;
  case AsyncTp::userbuffers:
    return 12 * e * T * h;
  case AsyncTp::none:
    break;
  }
  return 0;
}

namespace {

std::string stage_name(const StageMemory& s, int p, bool first, bool last) {
  std::string what;
  if (first) what += "embeddings, ";
  what += fmt::format("{} blocks", s.blocks);
  if (last) what += ", head and loss";
  const std::string moment = s.moment.empty() ? "" : ", peak at the " + s.moment;
  return fmt::format("stage {} of {} ({}, {:g} micro-batches in flight{})", s.stage, p, what,
                     s.in_flight, moment);
}

}  // namespace

std::vector<std::vector<PipeOp>> stage_orders(const ParallelMemoryInput& in) {
  const auto& l = in.layout;
  const int p = l.pipeline_parallel;
  if (l.virtual_stages > 1 && piped_stage(in) && pytorch_tp(in)) {
    std::vector<std::vector<PipeOp>> ops(static_cast<std::size_t>(p));
    for (int s = 0; s < p; ++s)
      ops[static_cast<std::size_t>(s)] =
          torch_interleaved_ops(p, s, l.virtual_stages, l.micro_batches);
    return ops;
  }
  return schedule_ops(l.schedule, p, l.virtual_stages, l.micro_batches);
}

ParallelMemory parallel_memory(const ParallelMemoryInput& in, const PipelineWalk& walk) {
  const auto& l = in.layout;
  const auto& hw = *in.hardware;
  const int p = l.pipeline_parallel;
  ParallelMemory out;
  // The stages' op lists, once, where model chunks make their held bytes depend on the order.
  std::vector<std::vector<PipeOp>> ops;
  if (l.virtual_stages > 1) ops = stage_orders(in);
  for (int s = 0; s < p; ++s) {
    const auto* stage_ops = ops.empty() ? nullptr : &ops[static_cast<std::size_t>(s)];
    const auto blocks = static_cast<double>(stage_blocks(l, in.model->layers, s));
    StageShare share{blocks, s == 0, s == p - 1, stage_ops, s, {}};
    const auto parts = pipeline_parts(l, in.model->layers);
    for (std::size_t k = static_cast<std::size_t>(s); k < parts.size();
         k += static_cast<std::size_t>(p))
      share.chunks.push_back(static_cast<double>(parts[k]));
    StageMemory st;
    st.stage = s;
    st.blocks = blocks;
    st.in_flight = walk.peak_in_flight.at(static_cast<std::size_t>(s));
    stage_states(in, share, st);
    // Block indices of the stage (its first chunk's, for the interleaved schedule: every:N
    // spreads evenly, so the count per stage is the same).
    stage_activations(in, share, static_cast<int>(stage_first_block(l, in.model->layers, s)), st);
    const double allocated = st.total();
    st.overhead_bytes = hw.cuda_context_bytes + hw.nccl_workspace_bytes +
                        hw.fragmentation * allocated + async_tp_bytes(in);
    if (st.total() > out.peak_bytes) {
      out.peak_bytes = st.total();
      out.peak_stage = s;
      out.peak_name = stage_name(st, p, share.first, share.last);
    }
    out.stages.push_back(st);
  }
  return out;
}

}  // namespace shardplan::costmodel
