// A GPT-style decoder with real forward and backward, run unit by unit so a sharding engine can
// gather a unit's flat parameters, run it, and free them again. Built from a documents::ModelSpec:
//
//   x₀ = wte[tokens] (+ wpe[t] for learned positions)                       embedding unit
//   per block, pre-norm (GPT-2 / Llama):                                    block units
//     a = x + Attn(Norm₁(x));  y = a + MLP(Norm₂(a))
//   or with GPT-NeoX's parallel residual (modeling_gpt_neox.py, use_parallel_residual):
//     y = x + Attn(Norm₁(x)) + MLP(Norm₂(x))
//   loss = mean over tokens of −log softmax(Norm_f(x_L) · Woutᵀ)[target]    head unit
//
// Attention is causal multi-head with grouped-query key/value heads and an explicit head_dim,
// rotary positions (rotate-half, over the whole head) when the spec says rotary; Norm is LayerNorm
// with bias or RMSNorm; MLP is GELU (tanh) or SwiGLU; linear biases exist where the tensor list
// has them; the head is tied to wte or has its own matrix. There is no dropout: the executor trains
// deterministically, whatever dropout rates the config names.
//
// Each unit's parameters (and gradients) are ONE flat buffer laid out as GptLayout says (the cost
// model's UnitTensors order). Parameter spans may be longer than the unit (a padded gathered
// buffer); only the first unit_size elements are read. Gradients are ADDED into the gradient span,
// so gradient accumulation over micro-batches needs nothing but zeroing once per step.
//
// Memory: every activation is allocated through the TrackedAllocator as `activations`. Hidden
// states are passed by moving buffers: a block keeps its input as its first saved activation, and
// its output becomes the next block's input; backward consumes the saved state and the incoming
// gradient and returns the gradient of the unit's input.
//
// Every kernel runs through a Backend (backend.hpp): the host's by default, the GPU's for the CUDA
// backend, on the memory of the allocator the model is given. The model never touches an element
// itself, so the same code allocates and frees the same buffers in the same order on both.
//
// The element type S (scalar.hpp) is float for the executor, bf16 or f16 for mixed precision
// (activations, parameters and gradients in S, every sum in fp32), double for the gradient check.
// Whatever S, the norm statistics, attention's log-sum-exp and the loss's log-probabilities and
// their gradient are accum_t<S> (fp32; fp64 for double), as PyTorch keeps them.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "documents/model.hpp"
#include "executor/context_parallel.hpp"
#include "executor/model_layout.hpp"
#include "executor/tensor_parallel.hpp"
#include "executor/tracked_allocator.hpp"
#include "kernels/backend.hpp"
#include "kernels/scalar.hpp"

namespace shardplan::executor {

struct BatchShape {
  std::int64_t batch = 0;                              // B, sequences in the micro-batch
  std::int64_t seq = 0;                                // T, tokens per sequence
  std::int64_t tokens() const { return batch * seq; }  // N = B·T
};

// Activation checkpointing of a block: none keeps every activation the backward needs; full
// keeps only the block's input and runs the block's forward again in its backward (Chen et al.
// 2016; torch.utils.checkpoint; Korthikanti et al. 2022 "full recompute").
enum class Checkpointing { none, full };

struct ModelOptions {
  // ε of every norm. ModelSpec does not carry it; 1e-5 is GPT-2's layer_norm_epsilon, GPT-NeoX's
  // layer_norm_eps and Llama-3's rms_norm_eps.
  double norm_eps = 1e-5;
  // Rotary base θ. ModelSpec does not carry it; 10000 is RoFormer's, Llama-2's and GPT-NeoX's.
  double rope_theta = 10000.0;
  // Fused attention (Backend::flash_attention_forward): a block keeps the log-sum-exp of each
  // score row [B, a, T] instead of the probabilities [B, a, T, T] (the cost model's flash option).
  bool flash_attention = false;
  // Tensor (and sequence) parallelism (tensor_parallel.hpp): the model is then one rank's local
  // model, its spec local_spec's; with sequence parallelism the hidden states between units are
  // this rank's 1/t of the N tokens. Not active by default.
  TensorParallel tensor_parallel;
  // Context parallelism (context_parallel.hpp): a batch's sequences are this rank's share of
  // them (BatchShape::seq = S/c tokens each, at context_positions in the sequence); attention is
  // ring attention over the group. Needs flash attention and rotary positions. Not active by
  // default.
  ContextParallel context_parallel;
};

// What a block's backward needs, with shapes (N = B·T, h = hidden, qw = heads·head_dim,
// kw = kv_heads·head_dim, I = intermediate, a = heads). With Checkpointing::full only `input`
// is kept. `mean` buffers exist for LayerNorm only; `mid` for the sequential residual only;
// `mlp_up` for SwiGLU only. The norm statistics and lse are accum_t<S>, the rest S.
template <class S> struct BlockActivations {
  using A = kernels::accum_t<S>;
  BatchShape shape;
  Checkpointing checkpointing = Checkpointing::none;
  TrackedBuffer<S> input;                   // [N, h]   x
  TrackedBuffer<S> norm1_out;               // [N, h]   Norm₁(x)
  TrackedBuffer<A> norm1_mean, norm1_rstd;  // [N]
  TrackedBuffer<S> q;                       // [N, qw]  after rotary
  TrackedBuffer<S> k, v;                    // [N, kw]  k after rotary
  TrackedBuffer<S> probs;                   // [B, a, T, T] attention probabilities (eager)
  TrackedBuffer<A> lse;                     // [B, a, T]    their rows' log-sum-exp (flash)
  TrackedBuffer<S> attn_out;                // [N, qw]  input of the output projection
  TrackedBuffer<S> mid;                     // [N, h]   a = x + Attn(...)
  TrackedBuffer<S> norm2_out;               // [N, h]
  TrackedBuffer<A> norm2_mean, norm2_rstd;  // [N]
  TrackedBuffer<S> mlp_pre;                 // [N, I]   up (GELU) or gate (SwiGLU) pre-activation
  TrackedBuffer<S> mlp_up;                  // [N, I]   SwiGLU up projection
  TrackedBuffer<S> mlp_act;                 // [N, I]   input of the down projection
};

template <class S> struct BlockForward {
  TrackedBuffer<S> output;  // [N, h]  the next unit's input
  BlockActivations<S> saved;
};

// The head keeps what PyTorch keeps for a *ForCausalLM loss computed in fp32 (HF
// modeling_llama.py LlamaForCausalLM.forward, loss_utils.py ForCausalLMLoss: logits.float()):
// the logits in S, which the model's output holds until the step ends, and the fp32
// log-probabilities log_softmax saves for its backward. Its backward makes two more [N, V]
// tensors, the fp32 gradient of the log-probabilities (nll_loss) and that of the logits in S
// (log_softmax), so the head's peak is 2 × N·V values in S and 2 × N·V in accum_t<S> (log_softmax
// here reads the S logits directly, without .float()'s transient fp32 copy).
template <class S> struct HeadActivations {
  using A = kernels::accum_t<S>;
  BatchShape shape;
  TrackedBuffer<S> input;                 // [N, h]
  TrackedBuffer<S> norm_out;              // [N, h]
  TrackedBuffer<A> norm_mean, norm_rstd;  // [N]
  TrackedBuffer<S> logits;                // [N, V]
  TrackedBuffer<A> log_probs;             // [N, V]  log_softmax(logits)
};

template <class S> struct HeadForward {
  double loss = 0;  // mean cross-entropy over the N tokens
  HeadActivations<S> saved;
};

// Bytes a block keeps for its backward (all of BlockActivations' buffers, input included), for
// elements of element_bytes = sizeof(S) bytes: the norm statistics and lse take sizeof(accum_t<S>)
// each (4 for bf16, f16 and float, 8 for double), everything else element_bytes. forward_block
// grows the tracked `activations` by exactly this: what it keeps beyond its input (already
// counted) plus its output [N, h]. Transiently it needs more: with Checkpointing::full the forward
// builds every buffer once before freeing all but the input, and a backward holds, besides the
// saved buffers not yet consumed, gradients [N, I] ×2 (×3 SwiGLU), [N, qw] ×2, [N, kw] ×2, [N, h]
// and a [T, T] scratch, all in S; dx reuses dy's buffer.
std::int64_t block_saved_bytes(const GptLayout& layout, BatchShape shape,
                               Checkpointing checkpointing, bool flash_attention,
                               std::int64_t element_bytes);
// Bytes the head keeps for its backward: input, norm output and logits in S, norm statistics and
// log-probabilities in accum_t<S>. Its backward adds the two [N, V] gradients transiently
// (head_backward_bytes): the log-probabilities' in accum_t<S>, the logits' in S.
std::int64_t head_saved_bytes(const GptLayout& layout, BatchShape shape,
                              std::int64_t element_bytes);
std::int64_t head_backward_bytes(const GptLayout& layout, BatchShape shape,
                                 std::int64_t element_bytes);

template <class S> class GptModel {
public:
  // Throws like GptLayout for a spec it cannot run, std::invalid_argument for flash attention on
  // a backend without it. backend: where the kernels run (not owned; nullptr: the host's).
  GptModel(const documents::ModelSpec& spec, TrackedAllocator& allocator, ModelOptions options = {},
           kernels::Backend<S>* backend = nullptr);

  const GptLayout& layout() const { return layout_; }
  const ModelOptions& options() const { return options_; }

  // tokens [B·T] → hidden states [N, h]. Throws std::invalid_argument for a token outside the
  // vocabulary or a sequence longer than the learned position table.
  TrackedBuffer<S> forward_embedding(std::span<const S> params,
                                     std::span<const std::int32_t> tokens, BatchShape shape) const;

  // x [N, h] → y [N, h], keeping what the backward needs (or only x, for Checkpointing::full).
  BlockForward<S> forward_block(std::span<const S> params, TrackedBuffer<S> input, BatchShape shape,
                                Checkpointing checkpointing) const;

  // x [N, h] and targets [N] → mean cross-entropy. embedding_params: the embedding unit's
  // parameters when the head is tied (its wte is the output matrix), else ignored (may be empty).
  HeadForward<S> forward_head(std::span<const S> params, std::span<const S> embedding_params,
                              TrackedBuffer<S> input, std::span<const std::int32_t> targets,
                              BatchShape shape) const;

  // Backward of the head for d(objective)/d(loss) = loss_scale (1 for one micro-batch; 1/M to
  // average M accumulated micro-batches). Adds into grad (the head unit's layout) and, when tied,
  // into embedding_grad (the embedding unit's layout). Returns d loss / d x [N, h].
  TrackedBuffer<S> backward_head(std::span<const S> params, std::span<const S> embedding_params,
                                 HeadActivations<S> saved, std::span<const std::int32_t> targets,
                                 std::span<S> grad, std::span<S> embedding_grad,
                                 double loss_scale = 1.0) const;

  // dy [N, h] → dx [N, h], adding the block's parameter gradients into grad. With
  // Checkpointing::full it first runs the block's forward again from the saved input.
  TrackedBuffer<S> backward_block(std::span<const S> params, BlockActivations<S> saved,
                                  TrackedBuffer<S> d_output, std::span<S> grad) const;

  // dx [N, h] → adds into the embedding unit's gradient (wte rows of the tokens, wpe rows).
  void backward_embedding(std::span<const std::int32_t> tokens, TrackedBuffer<S> d_output,
                          std::span<S> grad, BatchShape shape) const;

private:
  using A = kernels::accum_t<S>;
  // An activation of `elements` elements of T (S, or A for the statistics and log-probabilities).
  template <class T = S> TrackedBuffer<T> activation(std::int64_t elements) const {
    return allocator_.template allocate<T>(MemoryCategory::activations, elements);
  }
  // For an activation the next kernel writes completely (no zeroing).
  template <class T = S> TrackedBuffer<T> written_activation(std::int64_t elements) const {
    return allocator_.template allocate_uninitialized<T>(MemoryCategory::activations, elements);
  }
  // Rotary positions, then causal attention: a.attn_out (and a.lse or a.probs) from a.q, a.k, a.v.
  void attention_core_forward(BlockActivations<S>& a) const;
  // Context parallelism (context_parallel_block.cpp): ring attention's forward, and its
  // backward adding into dq, dk, dv (which it replaces by this rank's own dK, dV at the end).
  void ring_attention_forward(BlockActivations<S>& a) const;
  void ring_attention_backward(BlockActivations<S>& a, const S* d_attn_out, TrackedBuffer<S>& dq,
                               TrackedBuffer<S>& dk, TrackedBuffer<S>& dv) const;
  // n elements to the next rank of the ring, the previous rank's n into a new buffer.
  TrackedBuffer<S> ring_pass(const S* send, std::int64_t n) const;
  // Runs the block's forward from saved.input, filling every saved buffer, into `output`.
  void run_block(const S* params, BlockActivations<S>& saved, TrackedBuffer<S>& output) const;
  // n: the rows the norm runs on (N, or N/t under sequence parallelism).
  void norm_forward(std::int64_t n, const S* x, const S* params, NormOffsets norm,
                    TrackedBuffer<S>& out, TrackedBuffer<A>& mean, TrackedBuffer<A>& rstd) const;
  void norm_backward(std::int64_t n, S* dx, S* grad, const S* dy, const S* x, const S* params,
                     NormOffsets norm, const TrackedBuffer<A>& mean,
                     const TrackedBuffer<A>& rstd) const;
  void norm_backward_rows(std::int64_t n, S* dx, S* grad, const S* dy, const S* x, const S* params,
                          NormOffsets norm, NormOffsets grad_at, const TrackedBuffer<A>& mean,
                          const TrackedBuffer<A>& rstd) const;
  // The whole block's backward in parts (backward_block). The MLP's: from the gradient of its
  // activation to the gradient of norm2's output ([N, h]); frees d_act and the MLP's saved
  // activations (mlp_pre, mlp_up, norm2_out).
  TrackedBuffer<S> mlp_backward(const S* p, S* g, BlockActivations<S>& a,
                                TrackedBuffer<S> d_act) const;
  struct QkvGrads;
  // The q, k, v projections': from dq, dk, dv to the gradient of norm1's output ([N, h]); frees
  // them and the saved q, k, v and norm1_out.
  TrackedBuffer<S> qkv_backward(const S* p, S* g, BlockActivations<S>& a, QkvGrads grads) const;
  // Tensor parallelism (tensor_parallel_block.cpp). The tokens of the hidden states between
  // units: N, or N/t under sequence parallelism.
  std::int64_t local_tokens(BatchShape shape) const;
  bool sequence_parallel() const;
  void run_block_tp(const S* params, BlockActivations<S>& saved, TrackedBuffer<S>& output) const;
  TrackedBuffer<S> backward_block_tp(const S* params, BlockActivations<S>& saved,
                                     TrackedBuffer<S> d_output, S* grad) const;
  void attention_forward_tp(const S* p, BlockActivations<S>& a, const S* x) const;
  void mlp_forward_tp(const S* p, BlockActivations<S>& a, const S* x) const;
  // The attention core's backward, shared by the whole and the tensor-parallel block: dq, dk, dv
  // ([N, qw], [N, kw], [N, kw], rotary undone) from the gradient of the attention output; frees
  // d_attn_out and the core's saved activations (attn_out, probs, lse).
  struct QkvGrads {
    TrackedBuffer<S> dq, dk, dv;
  };
  QkvGrads attention_core_backward(BlockActivations<S>& a, TrackedBuffer<S> d_attn_out) const;
  TrackedBuffer<S> attention_backward_tp(const S* p, S* g, BlockActivations<S>& a,
                                         TrackedBuffer<S> d_attn_out) const;
  TrackedBuffer<S> mlp_backward_tp(const S* p, S* g, BlockActivations<S>& a,
                                   TrackedBuffer<S> d_act) const;
  // Vocabulary parallelism (tensor_parallel_vocab.cpp): the first token of this rank's shard;
  // the embedding's forward; the cross-entropy's sum over the N tokens from this rank's logits
  // (fills a.log_probs) and its logits' gradient (frees the logits and log-probabilities).
  std::int64_t vocab_begin() const;
  TrackedBuffer<S> forward_embedding_tp(const S* params, std::span<const std::int32_t> tokens,
                                        BatchShape shape) const;
  double vocab_parallel_loss(HeadActivations<S>& a, std::span<const std::int32_t> targets) const;
  TrackedBuffer<S> vocab_parallel_loss_backward(HeadActivations<S>& a,
                                                std::span<const std::int32_t> targets,
                                                double scale) const;
  // [N/t, h] shard → [N, h] (sequence parallelism's all-gather).
  TrackedBuffer<S> gather_tokens(const S* shard, BatchShape shape) const;
  // The column-parallel input: x itself, or its tokens gathered into `gathered`.
  const S* column_input(const TrackedBuffer<S>& x, BatchShape shape,
                        TrackedBuffer<S>& gathered) const;
  // A row-parallel linear's partial [N, h] summed over the group: all-reduced in place, or
  // reduce-scattered into this rank's [N/t, h].
  TrackedBuffer<S> reduce_tokens(TrackedBuffer<S> partial, BatchShape shape) const;
  void check_unit(std::span<const S> params, UnitKind kind, const char* what) const;
  void check_grad(std::span<S> grad, UnitKind kind, const char* what) const;
  void check_hidden(const TrackedBuffer<S>& x, BatchShape shape, const char* what) const;
  void check_tokens(std::span<const std::int32_t> tokens, BatchShape shape, const char* what) const;

  GptLayout layout_;
  TrackedAllocator& allocator_;
  ModelOptions options_;
  std::unique_ptr<kernels::Backend<S>> host_backend_;  // when none is given
  kernels::Backend<S>& be_;
};

extern template class GptModel<float>;
extern template class GptModel<double>;
extern template class GptModel<kernels::bf16>;
extern template class GptModel<kernels::f16>;

}  // namespace shardplan::executor
