#include "executor/gpt_model.hpp"
#include "kernels/backend.hpp"
#include "kernels/scalar.hpp"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

namespace shardplan::executor {

using kernels::Backend;
using kernels::bf16;
using kernels::data_type_v;
using kernels::f16;
using kernels::HostBackend;
namespace {

using documents::MlpKind;
using documents::NormKind;
using documents::PositionKind;

bool is_layernorm(const GptLayout& l) { return l.spec().norm == NormKind::layernorm; }
bool is_swiglu(const GptLayout& l) { return l.spec().mlp == MlpKind::swiglu; }
bool is_parallel(const GptLayout& l) { return l.spec().parallel_residual; }
bool is_rotary(const GptLayout& l) { return l.spec().positions == PositionKind::rotary; }

// sizeof(accum_t<S>) for sizeof(S) (scalar.hpp): fp32 for the 16-bit types and float.
std::int64_t accum_bytes(std::int64_t element_bytes) { return element_bytes == 8 ? 8 : 4; }

}  // namespace

std::int64_t block_saved_bytes(const GptLayout& layout, BatchShape shape,
                               Checkpointing checkpointing, bool flash_attention,
                               std::int64_t element_bytes) {
  const auto& m = layout.spec();
  const std::int64_t n = shape.tokens();
  if (checkpointing == Checkpointing::full) return n * m.hidden * element_bytes;
  const std::int64_t stats = is_layernorm(layout) ? 2 * n : n;        // mean and rstd, or rstd
  const std::int64_t rows = shape.batch * m.heads * shape.seq;        // score rows [B, a, T]
  std::int64_t e = n * m.hidden;                                      // input
  e += n * m.hidden;                                                  // norm1
  e += n * m.q_width() + 2 * n * m.kv_width();                        // q, k, v
  if (!flash_attention) e += rows * shape.seq;                        // probs
  e += n * m.q_width();                                               // attn_out
  if (!is_parallel(layout)) e += n * m.hidden;                        // mid
  e += n * m.hidden;                                                  // norm2
  e += (is_swiglu(layout) ? 3 : 2) * n * m.intermediate;              // mlp_pre, (mlp_up), mlp_act
  const std::int64_t acc = 2 * stats + (flash_attention ? rows : 0);  // norm1, norm2 stats; lse
  return e * element_bytes + acc * accum_bytes(element_bytes);
}

std::int64_t head_saved_bytes(const GptLayout& layout, BatchShape shape,
                              std::int64_t element_bytes) {
  const auto& m = layout.spec();
  const std::int64_t n = shape.tokens();
  const std::int64_t stats = is_layernorm(layout) ? 2 * n : n;
  return (2 * n * m.hidden + n * m.vocab) * element_bytes +   // input, norm_out, logits
         (stats + n * m.vocab) * accum_bytes(element_bytes);  // stats, log_probs
}

std::int64_t head_backward_bytes(const GptLayout& layout, BatchShape shape,
                                 std::int64_t element_bytes) {
  const std::int64_t nv = shape.tokens() * layout.spec().vocab;
  return nv * accum_bytes(element_bytes) + nv * element_bytes;  // d_log_probs, d_logits
}

template <class S>
GptModel<S>::GptModel(const documents::ModelSpec& spec, TrackedAllocator& allocator,
                      ModelOptions options, Backend<S>* backend)
    : layout_(spec), allocator_(allocator), options_(std::move(options)),
      host_backend_(backend ? nullptr : std::make_unique<HostBackend<S>>()),
      be_(backend ? *backend : *host_backend_) {
  if (options_.flash_attention && !be_.supports_flash_attention(spec.head_dim))
    throw std::invalid_argument(
        fmt::format("flash attention with head_dim {} is not available on the {} backend",
                    spec.head_dim, be_.name()));
  if (options_.context_parallel.active() && !(options_.flash_attention && is_rotary(layout_)))
    throw std::invalid_argument(fmt::format(
        "context parallelism runs ring attention on flash attention with rotary positions; {} "
        "has {} attention and {} positions",
        spec.name, options_.flash_attention ? "flash" : "eager",
        is_rotary(layout_) ? "rotary" : "learned"));
}

template <class S>
void GptModel<S>::check_unit(std::span<const S> params, UnitKind kind, const char* what) const {
  const auto need = layout_.unit_size(kind);
  if (static_cast<std::int64_t>(params.size()) < need)
    throw std::invalid_argument(
        fmt::format("{}: {} elements given, the unit has {}", what, params.size(), need));
}

template <class S>
void GptModel<S>::check_grad(std::span<S> grad, UnitKind kind, const char* what) const {
  check_unit(std::span<const S>(grad.data(), grad.size()), kind, what);
}

// Norm₁, Norm₂ or the final norm forward: allocates and fills out [N, h], mean, rstd [N].
template <class S>
void GptModel<S>::norm_forward(std::int64_t n, const S* x, const S* params, NormOffsets norm,
                               TrackedBuffer<S>& out, TrackedBuffer<A>& mean,
                               TrackedBuffer<A>& rstd) const {
  const std::int64_t h = layout_.spec().hidden;
  const A eps = static_cast<A>(options_.norm_eps);
  out = activation(n * h);
  if (is_layernorm(layout_)) mean = activation<A>(n);
  rstd = activation<A>(n);
  if (is_layernorm(layout_))
    be_.layernorm_forward(out.data(), mean.data(), rstd.data(), x, params + norm.weight,
                          params + norm.bias, n, h, eps);
  else
    be_.rmsnorm_forward(out.data(), rstd.data(), x, params + norm.weight, n, h, eps);
}

// Adds the norm's input gradient into dx and its parameter gradients into grad. Under sequence
// parallelism the parameter gradients of this rank's tokens are a partial sum: they are made in
// a zeroed buffer, all-reduced over the tensor-parallel group and added.
template <class S>
void GptModel<S>::norm_backward(std::int64_t n, S* dx, S* grad, const S* dy, const S* x,
                                const S* params, NormOffsets norm, const TrackedBuffer<A>& mean,
                                const TrackedBuffer<A>& rstd) const {
  const std::int64_t h = layout_.spec().hidden;
  if (sequence_parallel()) {
    const bool ln = is_layernorm(layout_);
    auto partial = activation(ln ? 2 * h : h);  // [h] weight (, [h] bias)
    NormOffsets at_zero{0, ln ? h : kAbsent};
    norm_backward_rows(n, dx, partial.data(), dy, x, params, norm, at_zero, mean, rstd);
    options_.tensor_parallel.group->all_reduce(
        partial.data(), partial.data(), static_cast<std::size_t>(partial.size()), data_type_v<S>);
    be_.add(grad + norm.weight, partial.data(), h);
    if (ln) be_.add(grad + norm.bias, partial.data() + h, h);
    return;
  }
  norm_backward_rows(n, dx, grad, dy, x, params, norm, norm, mean, rstd);
}

// The kernels of norm_backward: parameter gradients at grad_at's offsets of grad.
template <class S>
void GptModel<S>::norm_backward_rows(std::int64_t n, S* dx, S* grad, const S* dy, const S* x,
                                     const S* params, NormOffsets norm, NormOffsets grad_at,
                                     const TrackedBuffer<A>& mean,
                                     const TrackedBuffer<A>& rstd) const {
  const std::int64_t h = layout_.spec().hidden;
  if (is_layernorm(layout_))
    be_.layernorm_backward(dx, grad + grad_at.weight, grad + grad_at.bias, dy, x,
                           params + norm.weight, mean.data(), rstd.data(), n, h);
  else
    be_.rmsnorm_backward(dx, grad + grad_at.weight, dy, x, params + norm.weight, rstd.data(), n, h);
}

template <class S>
TrackedBuffer<S> GptModel<S>::forward_embedding(std::span<const S> params,
                                                std::span<const std::int32_t> tokens,
                                                BatchShape shape) const {
  check_unit(params, UnitKind::embedding, "forward_embedding params");
  check_tokens(tokens, shape, "forward_embedding tokens");
  const auto& m = layout_.spec();
  const auto& e = layout_.embedding();
  if (!is_rotary(layout_) && shape.seq > m.max_positions)
    throw std::invalid_argument(
        fmt::format("sequence of {} tokens is longer than the {} learned positions", shape.seq,
                    m.max_positions));
  if (options_.tensor_parallel.active()) return forward_embedding_tp(params.data(), tokens, shape);
  auto out = activation(shape.tokens() * m.hidden);  // [N, h]
  be_.embedding_forward(out.data(), tokens.data(), params.data() + e.tokens,
                        at(params.data(), e.positions), shape.batch, shape.seq, m.hidden);
  return out;
}

template <class S> void GptModel<S>::attention_core_forward(BlockActivations<S>& a) const {
  if (options_.context_parallel.active()) return ring_attention_forward(a);
  const auto& m = layout_.spec();
  const std::int64_t B = a.shape.batch, T = a.shape.seq, N = a.shape.tokens();
  if (is_rotary(layout_)) {
    be_.rope_forward(a.q.data(), B, T, m.heads, m.head_dim, options_.rope_theta);
    be_.rope_forward(a.k.data(), B, T, m.kv_heads, m.head_dim, options_.rope_theta);
  }
  if (options_.flash_attention) {
    a.lse = written_activation<A>(B * m.heads * T);
    a.attn_out = written_activation(N * m.q_width());
    be_.flash_attention_forward(a.attn_out.data(), a.lse.data(), a.q.data(), a.k.data(), a.v.data(),
                                B, T, m.heads, m.kv_heads, m.head_dim);
  } else {
    a.probs = written_activation(B * m.heads * T * T);
    a.attn_out = written_activation(N * m.q_width());
    be_.attention_forward(a.attn_out.data(), a.probs.data(), a.q.data(), a.k.data(), a.v.data(), B,
                          T, m.heads, m.kv_heads, m.head_dim);
  }
}

template <class S>
void GptModel<S>::run_block(const S* p, BlockActivations<S>& a, TrackedBuffer<S>& y) const {
  if (options_.tensor_parallel.active()) return run_block_tp(p, a, y);
  const auto& m = layout_.spec();
  const auto& L = layout_.block();
  const std::int64_t N = a.shape.tokens();
  const std::int64_t h = m.hidden, qw = m.q_width(), kw = m.kv_width(), I = m.intermediate;
  const S* x = a.input.data();

  // Attention: Norm₁, projections, rotary, causal softmax(QKᵀ/√d)·V.
  norm_forward(N, x, p, L.norm1, a.norm1_out, a.norm1_mean, a.norm1_rstd);
  a.q = activation(N * qw);
  a.k = activation(N * kw);
  a.v = activation(N * kw);
  be_.linear_forward(a.q.data(), a.norm1_out.data(), p + L.q.weight, at(p, L.q.bias), N, h, qw,
                     false);
  be_.linear_forward(a.k.data(), a.norm1_out.data(), p + L.k.weight, at(p, L.k.bias), N, h, kw,
                     false);
  be_.linear_forward(a.v.data(), a.norm1_out.data(), p + L.v.weight, at(p, L.v.bias), N, h, kw,
                     false);
  attention_core_forward(a);

  // Sequential residual: a = x + o(attn); the MLP reads Norm₂(a). Parallel: it reads Norm₂(x).
  const S* mlp_in = x;
  if (!is_parallel(layout_)) {
    a.mid = activation(N * h);
    be_.copy(a.mid.data(), x, N * h);
    be_.linear_forward(a.mid.data(), a.attn_out.data(), p + L.o.weight, at(p, L.o.bias), N, qw, h,
                       true);
    mlp_in = a.mid.data();
  }
  norm_forward(N, mlp_in, p, L.norm2, a.norm2_out, a.norm2_mean, a.norm2_rstd);
  a.mlp_pre = activation(N * I);
  a.mlp_act = activation(N * I);
  if (is_swiglu(layout_)) {
    a.mlp_up = activation(N * I);
    be_.linear_forward(a.mlp_pre.data(), a.norm2_out.data(), p + L.gate.weight, at(p, L.gate.bias),
                       N, h, I, false);
    be_.linear_forward(a.mlp_up.data(), a.norm2_out.data(), p + L.up.weight, at(p, L.up.bias), N, h,
                       I, false);
    be_.swiglu_forward(a.mlp_act.data(), a.mlp_pre.data(), a.mlp_up.data(), N * I);
  } else {
    be_.linear_forward(a.mlp_pre.data(), a.norm2_out.data(), p + L.up.weight, at(p, L.up.bias), N,
                       h, I, false);
    be_.gelu_forward(a.mlp_act.data(), a.mlp_pre.data(), N * I);
  }

  // y = a + down(act), or y = x + o(attn) + down(act).
  y = activation(N * h);
  if (is_parallel(layout_)) {
    be_.copy(y.data(), x, N * h);
    be_.linear_forward(y.data(), a.attn_out.data(), p + L.o.weight, at(p, L.o.bias), N, qw, h,
                       true);
  } else {
    be_.copy(y.data(), a.mid.data(), N * h);
  }
  be_.linear_forward(y.data(), a.mlp_act.data(), p + L.down.weight, at(p, L.down.bias), N, I, h,
                     true);
}

template <class S>
BlockForward<S> GptModel<S>::forward_block(std::span<const S> params, TrackedBuffer<S> input,
                                           BatchShape shape, Checkpointing checkpointing) const {
  check_unit(params, UnitKind::block, "forward_block params");
  check_hidden(input, shape, "forward_block input");
  BlockForward<S> f;
  f.saved.shape = shape;
  f.saved.checkpointing = checkpointing;
  f.saved.input = std::move(input);
  run_block(params.data(), f.saved, f.output);
  if (checkpointing == Checkpointing::full) {
    // Keep the input only; everything else is freed here and recomputed in the backward.
    BlockActivations<S> kept;
    kept.shape = shape;
    kept.checkpointing = checkpointing;
    kept.input = std::move(f.saved.input);
    f.saved = std::move(kept);
  }
  return f;
}

// Left whole: each step frees what it was the last to read, which sets the tracked peak; split,
// a dozen buffers and their release order would pass between the parts.
template <class S>
typename GptModel<S>::QkvGrads
GptModel<S>::attention_core_backward(BlockActivations<S>& a, TrackedBuffer<S> d_attn_out) const {
  const auto& m = layout_.spec();
  const std::int64_t B = a.shape.batch, T = a.shape.seq, N = a.shape.tokens();
  const std::int64_t qw = m.q_width(), kw = m.kv_width();
  auto dq = activation(N * qw);  // [N, qw]
  auto dk = activation(N * kw);  // [N, kw]
  auto dv = activation(N * kw);  // [N, kw]
  if (options_.context_parallel.active()) {
    ring_attention_backward(a, d_attn_out.data(), dq, dk, dv);
  } else if (options_.flash_attention) {
    auto delta = written_activation<A>(B * m.heads * T);  // [B, a, T] rowsum(dO ∘ O)
    be_.flash_attention_backward(dq.data(), dk.data(), dv.data(), delta.data(), d_attn_out.data(),
                                 a.attn_out.data(), a.lse.data(), a.q.data(), a.k.data(),
                                 a.v.data(), B, T, m.heads, m.kv_heads, m.head_dim);
  } else {
    // dP, then dS: one [T, T] on the host, every (sequence, head)'s on a GPU.
    auto scratch = activation(be_.attention_scratch_elements(B, T, m.heads));
    be_.attention_backward(dq.data(), dk.data(), dv.data(), scratch.data(), d_attn_out.data(),
                           a.probs.data(), a.q.data(), a.k.data(), a.v.data(), B, T, m.heads,
                           m.kv_heads, m.head_dim);
  }
  d_attn_out.reset();
  a.attn_out.reset();
  a.probs.reset();
  a.lse.reset();
  if (options_.context_parallel.active()) {
    const auto& cp = options_.context_parallel;
    const auto mine = context_positions(T * cp.size(), cp.size(), cp.rank());
    be_.rope_at(dq.data(), mine.data(), B, T, m.heads, m.head_dim, options_.rope_theta, true);
    be_.rope_at(dk.data(), mine.data(), B, T, m.kv_heads, m.head_dim, options_.rope_theta, true);
  } else if (is_rotary(layout_)) {
    be_.rope_backward(dq.data(), B, T, m.heads, m.head_dim, options_.rope_theta);
    be_.rope_backward(dk.data(), B, T, m.kv_heads, m.head_dim, options_.rope_theta);
  }
  return {std::move(dq), std::move(dk), std::move(dv)};
}

template <class S>
TrackedBuffer<S> GptModel<S>::mlp_backward(const S* p, S* g, BlockActivations<S>& a,
                                           TrackedBuffer<S> d_act) const {
  const auto& L = layout_.block();
  const std::int64_t N = a.shape.tokens(), h = layout_.spec().hidden,
                     I = layout_.spec().intermediate;
  auto d_norm2_out = activation(N * h);  // [N, h]
  {
    auto d_pre = activation(N * I);  // [N, I]
    if (is_swiglu(layout_)) {
      auto d_up = activation(N * I);  // [N, I]
      be_.swiglu_backward(d_pre.data(), d_up.data(), d_act.data(), a.mlp_pre.data(),
                          a.mlp_up.data(), N * I);
      d_act.reset();
      be_.linear_backward(d_norm2_out.data(), g + L.gate.weight, at(g, L.gate.bias), d_pre.data(),
                          a.norm2_out.data(), p + L.gate.weight, N, h, I);
      be_.linear_backward(d_norm2_out.data(), g + L.up.weight, at(g, L.up.bias), d_up.data(),
                          a.norm2_out.data(), p + L.up.weight, N, h, I);
    } else {
      be_.gelu_backward(d_pre.data(), a.mlp_pre.data(), d_act.data(), N * I);
      d_act.reset();
      be_.linear_backward(d_norm2_out.data(), g + L.up.weight, at(g, L.up.bias), d_pre.data(),
                          a.norm2_out.data(), p + L.up.weight, N, h, I);
    }
  }
  a.mlp_pre.reset();
  a.mlp_up.reset();
  a.norm2_out.reset();
  return d_norm2_out;
}

template <class S>
TrackedBuffer<S> GptModel<S>::qkv_backward(const S* p, S* g, BlockActivations<S>& a,
                                           QkvGrads grads) const {
  const auto& m = layout_.spec();
  const auto& L = layout_.block();
  const std::int64_t N = a.shape.tokens(), h = m.hidden, qw = m.q_width(), kw = m.kv_width();
  auto d_norm1_out = activation(N * h);  // [N, h]
  be_.linear_backward(d_norm1_out.data(), g + L.q.weight, at(g, L.q.bias), grads.dq.data(),
                      a.norm1_out.data(), p + L.q.weight, N, h, qw);
  be_.linear_backward(d_norm1_out.data(), g + L.k.weight, at(g, L.k.bias), grads.dk.data(),
                      a.norm1_out.data(), p + L.k.weight, N, h, kw);
  be_.linear_backward(d_norm1_out.data(), g + L.v.weight, at(g, L.v.bias), grads.dv.data(),
                      a.norm1_out.data(), p + L.v.weight, N, h, kw);
  grads.dq.reset();
  grads.dk.reset();
  grads.dv.reset();
  a.q.reset();
  a.k.reset();
  a.v.reset();
  a.norm1_out.reset();
  return d_norm1_out;
}

template <class S>
TrackedBuffer<S> GptModel<S>::backward_block(std::span<const S> params, BlockActivations<S> saved,
                                             TrackedBuffer<S> d_output, std::span<S> grad) const {
  check_unit(params, UnitKind::block, "backward_block params");
  check_grad(grad, UnitKind::block, "backward_block grad");
  check_hidden(saved.input, saved.shape, "backward_block saved input");
  check_hidden(d_output, saved.shape, "backward_block d_output");
  const S* p = params.data();
  S* g = grad.data();
  BlockActivations<S>& a = saved;
  if (a.checkpointing == Checkpointing::full) {
    TrackedBuffer<S> recomputed_output;
    run_block(p, a, recomputed_output);
  }
  if (options_.tensor_parallel.active()) return backward_block_tp(p, a, std::move(d_output), g);
  const auto& m = layout_.spec();
  const auto& L = layout_.block();
  const std::int64_t N = a.shape.tokens();
  const std::int64_t h = m.hidden, qw = m.q_width(), I = m.intermediate;
  // dy becomes dx in place: dx = dy + (the norms' input gradients).
  TrackedBuffer<S> dy = std::move(d_output);

  // Output projections read dy before it is changed. Parallel residual: both read dy.
  auto d_act = activation(N * I);  // [N, I]
  be_.linear_backward(d_act.data(), g + L.down.weight, at(g, L.down.bias), dy.data(),
                      a.mlp_act.data(), p + L.down.weight, N, I, h);
  a.mlp_act.reset();
  TrackedBuffer<S> d_attn_out;  // [N, qw]
  auto attention_output_backward = [&] {
    d_attn_out = activation(N * qw);
    be_.linear_backward(d_attn_out.data(), g + L.o.weight, at(g, L.o.bias), dy.data(),
                        a.attn_out.data(), p + L.o.weight, N, qw, h);
    if (!options_.flash_attention) a.attn_out.reset();  // flash's backward reads it again
  };
  if (is_parallel(layout_)) attention_output_backward();

  // MLP.
  auto d_norm2_out = mlp_backward(p, g, a, std::move(d_act));
  const S* mlp_in = is_parallel(layout_) ? a.input.data() : a.mid.data();
  norm_backward(N, dy.data(), g, d_norm2_out.data(), mlp_in, p, L.norm2, a.norm2_mean,
                a.norm2_rstd);
  d_norm2_out.reset();
  a.mid.reset();
  a.norm2_mean.reset();
  a.norm2_rstd.reset();

  // Attention. Sequential residual: dy now holds d a, the output projection's gradient.
  if (!is_parallel(layout_)) attention_output_backward();
  auto d_norm1_out = qkv_backward(p, g, a, attention_core_backward(a, std::move(d_attn_out)));
  norm_backward(N, dy.data(), g, d_norm1_out.data(), a.input.data(), p, L.norm1, a.norm1_mean,
                a.norm1_rstd);
  return dy;
}

template <class S>
HeadForward<S>
GptModel<S>::forward_head(std::span<const S> params, std::span<const S> embedding_params,
                          TrackedBuffer<S> input, std::span<const std::int32_t> targets,
                          BatchShape shape) const {
  check_unit(params, UnitKind::head, "forward_head params");
  if (layout_.spec().tied_embeddings)
    check_unit(embedding_params, UnitKind::embedding, "forward_head tied embedding params");
  check_hidden(input, shape, "forward_head input");
  check_tokens(targets, shape, "forward_head targets");
  const auto& m = layout_.spec();
  const auto& H = layout_.head();
  const std::int64_t N = shape.tokens();
  const S* w_out = m.tied_embeddings ? embedding_params.data() + layout_.embedding().tokens
                                     : params.data() + H.output;  // [V, h]
  HeadForward<S> f;
  HeadActivations<S>& a = f.saved;
  a.shape = shape;
  a.input = std::move(input);
  norm_forward(local_tokens(shape), a.input.data(), params.data(), H.norm, a.norm_out, a.norm_mean,
               a.norm_rstd);
  if (sequence_parallel()) a.norm_out = gather_tokens(a.norm_out.data(), shape);  // [N, h]
  a.logits = written_activation(N * m.vocab);                                     // [N, V]
  be_.linear_forward(a.logits.data(), a.norm_out.data(), w_out, static_cast<const S*>(nullptr), N,
                     m.hidden, m.vocab, false);
  a.log_probs = written_activation<A>(N * m.vocab);  // [N, V]
  if (options_.tensor_parallel.active()) {
    f.loss = vocab_parallel_loss(a, targets) / static_cast<double>(N);
    return f;
  }
  be_.log_softmax_forward(a.log_probs.data(), a.logits.data(), N, m.vocab);
  f.loss =
      be_.nll_loss_forward(a.log_probs.data(), targets.data(), N, m.vocab) / static_cast<double>(N);
  return f;
}

template <class S>
TrackedBuffer<S>
GptModel<S>::backward_head(std::span<const S> params, std::span<const S> embedding_params,
                           HeadActivations<S> saved, std::span<const std::int32_t> targets,
                           std::span<S> grad, std::span<S> embedding_grad,
                           double loss_scale) const {
  const auto& m = layout_.spec();
  check_unit(params, UnitKind::head, "backward_head params");
  check_grad(grad, UnitKind::head, "backward_head grad");
  if (m.tied_embeddings) {
    check_unit(embedding_params, UnitKind::embedding, "backward_head tied embedding params");
    check_grad(embedding_grad, UnitKind::embedding, "backward_head tied embedding grad");
  }
  check_hidden(saved.input, saved.shape, "backward_head saved input");
  check_tokens(targets, saved.shape, "backward_head targets");
  const auto& H = layout_.head();
  HeadActivations<S>& a = saved;
  const std::int64_t N = a.shape.tokens();
  const std::int64_t tokens_offset = layout_.embedding().tokens;
  const S* w_out = m.tied_embeddings ? embedding_params.data() + tokens_offset
                                     : params.data() + H.output;  // [V, h]
  S* dw_out = m.tied_embeddings ? embedding_grad.data() + tokens_offset : grad.data() + H.output;

  const double scale = loss_scale / static_cast<double>(N);
  TrackedBuffer<S> d_logits;  // [N, V], or [N, V/t] under tensor parallelism
  if (options_.tensor_parallel.active()) {
    d_logits = vocab_parallel_loss_backward(a, targets, scale);
  } else {
    // loss = (1/N) Σ −logp[target]: nll_loss's backward, then log_softmax's; as in PyTorch both
    // gradients are alive together with the saved logits and log-probabilities.
    auto d_log_probs = activation<A>(N * m.vocab);  // [N, V]
    be_.nll_loss_backward(d_log_probs.data(), targets.data(), N, m.vocab, static_cast<A>(scale));
    d_logits = written_activation(N * m.vocab);  // log_softmax_backward writes it
    be_.log_softmax_backward(d_logits.data(), d_log_probs.data(), a.log_probs.data(), N, m.vocab);
    d_log_probs.reset();
    a.log_probs.reset();
    a.logits.reset();
  }
  auto d_norm_out = activation(N * m.hidden);  // [N, h]
  be_.linear_backward(d_norm_out.data(), dw_out, static_cast<S*>(nullptr), d_logits.data(),
                      a.norm_out.data(), w_out, N, m.hidden, m.vocab);
  d_logits.reset();
  a.norm_out.reset();
  // Tensor parallelism: a partial sum over the vocabulary shards, summed over the group (the
  // output layer's column-parallel input gradient): [N, h], or this rank's [N/t, h].
  if (options_.tensor_parallel.active()) d_norm_out = reduce_tokens(std::move(d_norm_out), a.shape);
  const std::int64_t n = local_tokens(a.shape);
  auto dx = activation(n * m.hidden);  // [N, h], or [N/t, h]
  norm_backward(n, dx.data(), grad.data(), d_norm_out.data(), a.input.data(), params.data(), H.norm,
                a.norm_mean, a.norm_rstd);
  return dx;
}

template <class S>
void GptModel<S>::backward_embedding(std::span<const std::int32_t> tokens,
                                     TrackedBuffer<S> d_output, std::span<S> grad,
                                     BatchShape shape) const {
  check_grad(grad, UnitKind::embedding, "backward_embedding grad");
  check_tokens(tokens, shape, "backward_embedding tokens");
  check_hidden(d_output, shape, "backward_embedding d_output");
  const auto& e = layout_.embedding();
  if (sequence_parallel()) d_output = gather_tokens(d_output.data(), shape);
  if (options_.tensor_parallel.active()) {  // the rows of this rank's vocabulary shard
    be_.vocab_embedding_backward(
        grad.data() + e.tokens, at(grad.data(), e.positions), d_output.data(), tokens.data(),
        vocab_begin(), layout_.spec().vocab, shape.batch, shape.seq, layout_.spec().hidden);
    return;
  }
  be_.embedding_backward(grad.data() + e.tokens, at(grad.data(), e.positions), d_output.data(),
                         tokens.data(), shape.batch, shape.seq, layout_.spec().hidden);
}

template <class S>
void GptModel<S>::check_hidden(const TrackedBuffer<S>& x, BatchShape shape,
                               const char* what) const {
  if (shape.batch < 1 || shape.seq < 1)
    throw std::invalid_argument(
        fmt::format("{}: batch {} × sequence {} is empty", what, shape.batch, shape.seq));
  const std::int64_t need = local_tokens(shape) * layout_.spec().hidden;
  if (x.size() != need)
    throw std::invalid_argument(fmt::format("{}: {} elements, expected {} (B {} × T {} × h {})",
                                            what, x.size(), need, shape.batch, shape.seq,
                                            layout_.spec().hidden));
}

template <class S>
void GptModel<S>::check_tokens(std::span<const std::int32_t> tokens, BatchShape shape,
                               const char* what) const {
  if (static_cast<std::int64_t>(tokens.size()) != shape.tokens())
    throw std::invalid_argument(fmt::format("{}: {} tokens, expected B {} × T {}", what,
                                            tokens.size(), shape.batch, shape.seq));
  if (!allocator_.host_accessible()) return;  // on a GPU: drawn in range (synthetic_data.hpp)
  const std::int64_t vocab = options_.tensor_parallel.vocab(layout_.spec());
  for (auto t : tokens)
    if (t < 0 || t >= vocab)
      throw std::invalid_argument(
          fmt::format("{}: token {} outside the vocabulary of {}", what, t, vocab));
}

template class GptModel<float>;
template class GptModel<double>;
template class GptModel<bf16>;
template class GptModel<f16>;

}  // namespace shardplan::executor
