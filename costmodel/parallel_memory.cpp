#include "costmodel/parallel_memory.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace shardplan::costmodel {

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

double tp_local_elements(const UnitTensors& u, int t, bool embedding) {
  double n = 0;
  for (std::size_t i = 0; i < u.tensors.size(); ++i) {
    const auto& x = u.tensors[i];
    const bool split = x.is_matrix() && !(embedding && i > 0);  // the token table only
    n += static_cast<double>(x.elements()) / (split ? t : 1);
  }
  return n;
}

namespace {

// The stage's share of the model: blocks, and whether it holds the embeddings and the head.
struct StageShare {
  double blocks = 0;
  bool first = false, last = false;
};

// Model states of one stage on one rank: split by t, sharded over the data-parallel group.
void stage_states(const ParallelMemoryInput& in, const StageShare& share, StageMemory& out) {
  const auto& m = *in.model;
  const auto& s = in.spec;
  const int t = in.layout.tensor_parallel;
  const StateBytes sb = state_bytes(in.job.precision, s, Accounting::framework);
  const int d = std::max(1, in.layout.data_parallel(in.cluster.gpus));
  const double S = std::min(s.group(d), d);
  double elems = share.blocks * tp_local_elements(m.block, t, false);
  double opt = share.blocks *
               static_cast<double>(optimizer_state_elements(m.block, in.job.optimizer)) *
               tp_local_elements(m.block, t, false) /
               std::max<double>(1, static_cast<double>(m.block.params()));
  auto add = [&](const UnitTensors& u, bool embedding) {
    const double local = tp_local_elements(u, t, embedding);
    elems += local;
    opt += static_cast<double>(optimizer_state_elements(u, in.job.optimizer)) * local /
           std::max<double>(1, static_cast<double>(u.params()));
  };
  if (share.first) add(m.embedding, true);
  if (share.last) add(m.head, false);
  // Tied embeddings across stages: the last stage keeps its own copy of the word embeddings for
  // the output layer and the two copies' gradients are all-reduced (Megatron-core's
  // LanguageModule.setup_embeddings_and_output_layer, shared_embedding_or_output_weight).
  if (share.last && m.tied_embeddings && !m.embedding.tensors.empty() &&
      in.layout.pipeline_parallel > 1) {
    UnitTensors word;
    word.tensors.push_back(m.embedding.tensors.front());
    // The executor's copy is its whole embedding unit, a learned position table too
    // (executor/pipeline.hpp).
    add(in.job.recipe == Recipe::executor ? m.embedding : word, true);
  }
  out.local_params = elems;
  out.param_bytes = elems * sb.param / (s.shard_parameters ? S : 1);
  out.grad_bytes = elems * sb.grad / (s.shard_gradients ? S : 1);
  out.optimizer_bytes = (sb.master * elems + sb.moment * opt) / (s.shard_optimizer ? S : 1);
  // torch DDP's buckets hold a second copy of the whole gradients (gradient_as_bucket_view=False),
  // as the simulator counts them (costmodel/simulator.cpp, grad_bucket_copy).
  if (s.grad_bucket_copy) out.buffer_bytes += elems * sb.grad;
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
// executor/tensor_parallel_block.cpp and tensor_parallel_vocab.cpp) on one rank of a stage
// (c = 1). N = s·b tokens per micro-batch; n = N/t under sequence parallelism, else N (the hidden
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
struct ExecutorStage {
  double saved = 0, transient = 0;
  // The parts of `saved` and `transient` the first-use walk needs (executor_first_use_peak).
  double head_saved = 0, head_transient = 0, block_transient = 0, first_block_saved = 0;
};
ExecutorStage executor_stage(const ModelSpec& m, const TrainingJob& j, const ParallelLayout& l,
                             const StageShare& share, int first_block, double e) {
  const double t = l.tensor_parallel;
  const double T = static_cast<double>(j.seq_len) * static_cast<double>(j.micro_batch);
  const double n = T / (l.sequence_parallel ? t : 1.0);
  const double s = static_cast<double>(j.seq_len), h = static_cast<double>(m.hidden);
  const double q = static_cast<double>(m.q_width()), kv = static_cast<double>(m.kv_width());
  const double I = static_cast<double>(m.intermediate), V = static_cast<double>(m.vocab);
  const double a = static_cast<double>(m.heads);
  const double stats = (m.norm == NormKind::layernorm ? 2.0 : 1.0) * 4 * n;  // one norm's
  const double mlp_width = m.mlp == MlpKind::gelu ? 2.0 : 3.0;
  const double core = j.attention == AttentionImpl::eager ? e * a * s * T : 4 * a * T;
  const double block = e * n * h * (m.parallel_residual ? 3.0 : 4.0) +
                       e * T * (2 * q + 2 * kv) / t + mlp_width * e * T * I / t + core / t +
                       2 * stats;
  ExecutorStage out;
  bool any_full = false;
  for (std::int64_t b = 0; b < static_cast<std::int64_t>(share.blocks); ++b) {
    const bool cp = j.block_checkpointed(first_block + b);
    any_full |= cp;
    const double kept = cp ? e * n * h : block;
    if (b == 0) out.first_block_saved = kept;
    out.saved += kept;
  }
  if (share.blocks > 0)
    out.block_transient = e * n * h + e * T * h * (l.sequence_parallel ? 2.0 : 1.0) +
                          (mlp_width - 1) * e * T * I / t + (any_full ? block : 0);
  out.transient = out.block_transient;
  if (share.first || share.last) out.saved += 8 * T;  // int32 tokens and targets
  if (share.last) {
    out.head_saved = e * (n + T) * h + stats + (e + 4) * T * V / t;
    out.saved += out.head_saved;
    out.head_transient =
        t == 1 ? (4 + e) * T * V : std::max(e * T * V / t, e * T * h - 4 * T * V / t);
    out.transient = std::max(out.transient, out.head_transient);
  } else {
    out.transient = std::max(out.transient, 2 * e * T * h);  // the output beside the received
  }
  return out;
}

// Without a pipeline the executor's sharding engine keeps DDP's whole gradients as autograd keeps
// .grad: each unit's is allocated at its first use in the backward and kept to the step (a tied
// head's backward is the embedding's first use). The peak is then the largest of the backward's
// moments, each with the saved activations still alive and the gradients allocated so far:
//   the head's                all blocks' saved, the head's transient; the head's gradient
//   the last block's MLP      the head's saved freed (its input's gradient is the block's dy),
//                             the block's transient; the head's and the last block's gradients
//   the first block's MLP     only block 0's saved; every block's gradient
//   the embedding's           its input gradient [n, h] (gathered [N, h] under sequence
//                             parallelism) and the tokens; every gradient
// (linear in the blocks between, so the first and last block bound them). Sets the stage's
// gradient and activation bytes to that moment's.
void executor_first_use_peak(const ParallelMemoryInput& in, const ExecutorStage& x,
                             StageMemory& out) {
  const auto& m = *in.model;
  const int t = in.layout.tensor_parallel;
  const double grad_b = out.grad_bytes / std::max(1.0, out.local_params);  // bytes per element
  const double e = dtype_bytes(compute_dtype(in.job.precision));
  const double T = static_cast<double>(in.job.seq_len) * static_cast<double>(in.job.micro_batch);
  const double n = T / (in.layout.sequence_parallel ? t : 1);
  const double h = static_cast<double>(m.hidden);
  const double L = static_cast<double>(m.layers);
  const double head = tp_local_elements(m.head, t, false) +
                      (m.tied_embeddings ? tp_local_elements(m.embedding, t, true) : 0);
  const double block = tp_local_elements(m.block, t, false);
  struct Moment {
    double activations, grad_elements;
  };
  const double rest = x.saved - x.head_saved;  // blocks, tokens and targets
  const Moment moments[] = {
      {x.saved + x.head_transient, head},
      {rest + x.block_transient, head + block},
      {x.first_block_saved + 8 * T + x.block_transient, head + L * block},
      {8 * T + e * n * h + (in.layout.sequence_parallel ? e * T * h : 0), out.local_params}};
  double best = -1;
  for (const auto& moment : moments) {
    const double total = moment.activations + moment.grad_elements * grad_b;
    if (total <= best) continue;
    best = total;
    out.activation_bytes = moment.activations;
    out.grad_bytes = moment.grad_elements * grad_b;
  }
}

// Saved bytes per micro-batch of the stage's blocks (each checkpointed or not by the job's mode,
// by its place in the model), the largest transient of one of them, and the stage's extras.
void stage_activations(const ParallelMemoryInput& in, const StageShare& share, int first_block,
                       StageMemory& out) {
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
  if (share.first) saved += embedding_saved(m, j, l);
  if (share.last) saved += head_saved(m, j, l, e);
  double transient = any_checkpointed ? layer.total() : 0;  // one block rebuilt at a time
  if (l.sequence_parallel)
    transient += e * T * static_cast<double>(m.hidden);  // the all-gathered input
  if (share.last)
    transient += e * T * static_cast<double>(m.vocab) / l.tensor_parallel;  // the logits
  out.activation_bytes = saved * out.in_flight + transient;
  if (j.recipe == Recipe::executor && l.context_parallel == 1) {
    const ExecutorStage x = executor_stage(m, j, l, share, first_block, e);
    out.activation_bytes = x.saved * out.in_flight + x.transient;
    // One stage holding the whole model with torch DDP's whole gradients (autograd's .grad,
    // allocated at first use; the bucket copy beside them). Megatron-core's DDP, whose buckets
    // are views of a gradient buffer allocated with the model (grad_bucket_copy false), holds
    // them all from the start, as the executor's pipeline stages do.
    if (l.pipeline_parallel == 1 && in.spec.grad_bucket_copy && !in.spec.shard_gradients)
      executor_first_use_peak(in, x, out);
  }
  // Ring attention: the K and V chunk being used and the one arriving (Transformer Engine's
  // AttnFuncWithCPAndKVP2P double-buffers them), each of the local sequence.
  if (l.context_parallel > 1)
    out.buffer_bytes += 2 * 2 * e * T * static_cast<double>(m.kv_width()) / l.tensor_parallel;
}

std::string stage_name(const StageMemory& s, int p, bool first, bool last) {
  std::string what;
  if (first) what += "embeddings, ";
  what += fmt::format("{} blocks", s.blocks);
  if (last) what += ", head and loss";
  return fmt::format("stage {} of {} ({}, {:g} micro-batches in flight)", s.stage, p, what,
                     s.in_flight);
}

}  // namespace

ParallelMemory parallel_memory(const ParallelMemoryInput& in, const PipelineWalk& walk) {
  const auto& l = in.layout;
  const auto& hw = *in.hardware;
  const int p = l.pipeline_parallel;
  const double per_stage = static_cast<double>(in.model->layers) / p;
  ParallelMemory out;
  for (int s = 0; s < p; ++s) {
    StageShare share{per_stage, s == 0, s == p - 1};
    StageMemory st;
    st.stage = s;
    st.blocks = per_stage;
    st.in_flight = walk.peak_in_flight.at(static_cast<std::size_t>(s));
    stage_states(in, share, st);
    // Block indices of the stage (its first chunk's, for the interleaved schedule: every:N
    // spreads evenly, so the count per stage is the same).
    stage_activations(in, share, static_cast<int>(per_stage / l.virtual_stages) * s, st);
    const double allocated = st.total();
    st.overhead_bytes =
        hw.cuda_context_bytes + hw.nccl_workspace_bytes + hw.fragmentation * allocated;
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
