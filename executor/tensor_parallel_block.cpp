// A block of GptModel under tensor parallelism (tensor_parallel.hpp): the same kernels as
// gpt_model.cpp's block on the local widths (heads/t, kv_heads/t, intermediate/t), with
// Megatron's f and g around the column- and row-parallel linears. N is the micro-batch's tokens,
// n = local_tokens(): N, or N/t under sequence parallelism. Shapes:
//   input, mid, norm1_out, norm2_out     [n, h]   (the token shard under sequence parallelism)
//   q [N, qw/t], k, v [N, kw/t], attn_out [N, qw/t], mlp_pre, mlp_up, mlp_act [N, I/t]
#include <fmt/format.h>

#include "executor/gpt_model.hpp"
#include "kernels/scalar.hpp"

namespace shardplan::executor {

using kernels::bf16;
using kernels::data_type_v;
using kernels::f16;
namespace {

using documents::MlpKind;
using documents::PositionKind;

}  // namespace

template <class S> bool GptModel<S>::sequence_parallel() const {
  return options_.tensor_parallel.active() && options_.tensor_parallel.sequence_parallel;
}

template <class S> std::int64_t GptModel<S>::local_tokens(BatchShape shape) const {
  if (!sequence_parallel()) return shape.tokens();
  const int t = options_.tensor_parallel.size();
  if (shape.tokens() % t != 0)
    throw std::invalid_argument(fmt::format(
        "sequence parallelism over {} ranks: {} tokens per micro-batch are not divisible by {}", t,
        shape.tokens(), t));
  return shape.tokens() / t;
}

template <class S>
TrackedBuffer<S> GptModel<S>::gather_tokens(const S* shard, BatchShape shape) const {
  const std::int64_t h = layout_.spec().hidden, n = local_tokens(shape);
  auto& g = *options_.tensor_parallel.group;
  auto whole = written_activation(shape.tokens() * h);  // [N, h]
  // MPI's in-place form would need the shard at its place in `whole`; a copy does the same.
  be_.copy(whole.data() + g.rank() * n * h, shard, n * h);
  g.all_gather(whole.data() + g.rank() * n * h, whole.data(), static_cast<std::size_t>(n * h),
               data_type_v<S>);
  return whole;
}

template <class S>
const S* GptModel<S>::column_input(const TrackedBuffer<S>& x, BatchShape shape,
                                   TrackedBuffer<S>& gathered) const {
  if (!sequence_parallel()) return x.data();
  gathered = gather_tokens(x.data(), shape);
  return gathered.data();
}

template <class S>
TrackedBuffer<S> GptModel<S>::reduce_tokens(TrackedBuffer<S> partial, BatchShape shape) const {
  auto& g = *options_.tensor_parallel.group;
  const std::int64_t h = layout_.spec().hidden, n = local_tokens(shape);
  if (!sequence_parallel()) {
    g.all_reduce(partial.data(), partial.data(), static_cast<std::size_t>(partial.size()),
                 data_type_v<S>);
    return partial;
  }
  auto mine = written_activation(n * h);  // [N/t, h]
  g.reduce_scatter(partial.data(), mine.data(), static_cast<std::size_t>(n * h), data_type_v<S>);
  return mine;
}

// Norm₁, q/k/v (column-parallel), rotary and attention over this rank's heads.
template <class S>
void GptModel<S>::attention_forward_tp(const S* p, BlockActivations<S>& a, const S* x) const {
  const auto& m = layout_.spec();
  const auto& L = layout_.block();
  const std::int64_t N = a.shape.tokens();
  const std::int64_t h = m.hidden, qw = m.q_width(), kw = m.kv_width();
  norm_forward(local_tokens(a.shape), x, p, L.norm1, a.norm1_out, a.norm1_mean, a.norm1_rstd);
  TrackedBuffer<S> gathered;
  const S* in = column_input(a.norm1_out, a.shape, gathered);  // f: [N, h]
  a.q = activation(N * qw);
  a.k = activation(N * kw);
  a.v = activation(N * kw);
  be_.linear_forward(a.q.data(), in, p + L.q.weight, at(p, L.q.bias), N, h, qw, false);
  be_.linear_forward(a.k.data(), in, p + L.k.weight, at(p, L.k.bias), N, h, kw, false);
  be_.linear_forward(a.v.data(), in, p + L.v.weight, at(p, L.v.bias), N, h, kw, false);
  gathered.reset();
  attention_core_forward(a);
}

// Norm₂ and the MLP's column-parallel up (and gate) over this rank's intermediate columns.
template <class S>
void GptModel<S>::mlp_forward_tp(const S* p, BlockActivations<S>& a, const S* x) const {
  const auto& m = layout_.spec();
  const auto& L = layout_.block();
  const std::int64_t N = a.shape.tokens(), h = m.hidden, I = m.intermediate;
  norm_forward(local_tokens(a.shape), x, p, L.norm2, a.norm2_out, a.norm2_mean, a.norm2_rstd);
  TrackedBuffer<S> gathered;
  const S* in = column_input(a.norm2_out, a.shape, gathered);  // f: [N, h]
  a.mlp_pre = activation(N * I);
  a.mlp_act = activation(N * I);
  if (m.mlp == MlpKind::swiglu) {
    a.mlp_up = activation(N * I);
    be_.linear_forward(a.mlp_pre.data(), in, p + L.gate.weight, at(p, L.gate.bias), N, h, I, false);
    be_.linear_forward(a.mlp_up.data(), in, p + L.up.weight, at(p, L.up.bias), N, h, I, false);
    be_.swiglu_forward(a.mlp_act.data(), a.mlp_pre.data(), a.mlp_up.data(), N * I);
  } else {
    be_.linear_forward(a.mlp_pre.data(), in, p + L.up.weight, at(p, L.up.bias), N, h, I, false);
    be_.gelu_forward(a.mlp_act.data(), a.mlp_pre.data(), N * I);
  }
}

// The row-parallel projections' partial sums (the bias on rank 0 only) go through g; the
// residual is added to the reduced sum: a = x + g(o), y = a + g(down), or, with the parallel
// residual, y = x + g(o + down).
template <class S>
void GptModel<S>::run_block_tp(const S* p, BlockActivations<S>& a, TrackedBuffer<S>& y) const {
  const auto& m = layout_.spec();
  const auto& L = layout_.block();
  const std::int64_t N = a.shape.tokens(), n = local_tokens(a.shape), h = m.hidden;
  const bool first = options_.tensor_parallel.rank() == 0;
  const S* x = a.input.data();
  attention_forward_tp(p, a, x);
  auto partial = written_activation(N * h);  // [N, h]
  be_.linear_forward(partial.data(), a.attn_out.data(), p + L.o.weight,
                     first ? at(p, L.o.bias) : nullptr, N, m.q_width(), h, false);
  const S* mlp_in = x;
  if (!m.parallel_residual) {
    a.mid = reduce_tokens(std::move(partial), a.shape);  // [n, h]
    be_.add(a.mid.data(), x, n * h);
    mlp_in = a.mid.data();
    partial = written_activation(N * h);
  }
  mlp_forward_tp(p, a, mlp_in);
  be_.linear_forward(partial.data(), a.mlp_act.data(), p + L.down.weight,
                     first ? at(p, L.down.bias) : nullptr, N, m.intermediate, h,
                     m.parallel_residual);
  y = reduce_tokens(std::move(partial), a.shape);  // [n, h]
  be_.add(y.data(), mlp_in, n * h);
}

// From d attn_out [N, qw/t] to Norm₁'s input gradient, added into dx [n, h].
template <class S>
TrackedBuffer<S> GptModel<S>::attention_backward_tp(const S* p, S* g, BlockActivations<S>& a,
                                                    TrackedBuffer<S> d_attn_out) const {
  const auto& m = layout_.spec();
  const auto& L = layout_.block();
  const std::int64_t N = a.shape.tokens();
  const std::int64_t h = m.hidden, qw = m.q_width(), kw = m.kv_width();
  auto [dq, dk, dv] = attention_core_backward(a, std::move(d_attn_out));
  TrackedBuffer<S> gathered;
  const S* in = column_input(a.norm1_out, a.shape, gathered);  // gathered again for dW
  auto d_in = activation(N * h);                               // [N, h] partial over the group
  be_.linear_backward(d_in.data(), g + L.q.weight, at(g, L.q.bias), dq.data(), in, p + L.q.weight,
                      N, h, qw);
  be_.linear_backward(d_in.data(), g + L.k.weight, at(g, L.k.bias), dk.data(), in, p + L.k.weight,
                      N, h, kw);
  be_.linear_backward(d_in.data(), g + L.v.weight, at(g, L.v.bias), dv.data(), in, p + L.v.weight,
                      N, h, kw);
  gathered.reset();
  a.q.reset();
  a.k.reset();
  a.v.reset();
  a.norm1_out.reset();
  return reduce_tokens(std::move(d_in), a.shape);  // f's backward: [n, h]
}

// From d mlp_act [N, I/t] to d Norm₂'s output [n, h] (reduced over the group).
template <class S>
TrackedBuffer<S> GptModel<S>::mlp_backward_tp(const S* p, S* g, BlockActivations<S>& a,
                                              TrackedBuffer<S> d_act) const {
  const auto& m = layout_.spec();
  const auto& L = layout_.block();
  const std::int64_t N = a.shape.tokens(), h = m.hidden, I = m.intermediate;
  TrackedBuffer<S> gathered;
  const S* in = column_input(a.norm2_out, a.shape, gathered);
  auto d_in = activation(N * h);  // [N, h] partial over the group
  auto d_pre = activation(N * I);
  if (m.mlp == MlpKind::swiglu) {
    auto d_up = activation(N * I);
    be_.swiglu_backward(d_pre.data(), d_up.data(), d_act.data(), a.mlp_pre.data(), a.mlp_up.data(),
                        N * I);
    d_act.reset();
    be_.linear_backward(d_in.data(), g + L.gate.weight, at(g, L.gate.bias), d_pre.data(), in,
                        p + L.gate.weight, N, h, I);
    be_.linear_backward(d_in.data(), g + L.up.weight, at(g, L.up.bias), d_up.data(), in,
                        p + L.up.weight, N, h, I);
  } else {
    be_.gelu_backward(d_pre.data(), a.mlp_pre.data(), d_act.data(), N * I);
    d_act.reset();
    be_.linear_backward(d_in.data(), g + L.up.weight, at(g, L.up.bias), d_pre.data(), in,
                        p + L.up.weight, N, h, I);
  }
  d_pre.reset();
  gathered.reset();
  a.mlp_pre.reset();
  a.mlp_up.reset();
  a.norm2_out.reset();
  return reduce_tokens(std::move(d_in), a.shape);  // f's backward: [n, h]
}

// dy [n, h] becomes dx in place. The row-parallel linears read dy whole (g's backward: all-gather
// of the tokens under sequence parallelism); their bias gradient is the same on every rank.
template <class S>
TrackedBuffer<S> GptModel<S>::backward_block_tp(const S* p, BlockActivations<S>& a,
                                                TrackedBuffer<S> dy, S* g) const {
  const auto& m = layout_.spec();
  const auto& L = layout_.block();
  const std::int64_t N = a.shape.tokens(), n = local_tokens(a.shape), h = m.hidden;
  const std::int64_t qw = m.q_width(), I = m.intermediate;
  TrackedBuffer<S> dy_gathered;
  const S* dy_all = column_input(dy, a.shape, dy_gathered);  // [N, h]
  auto d_act = activation(N * I);
  be_.linear_backward(d_act.data(), g + L.down.weight, at(g, L.down.bias), dy_all, a.mlp_act.data(),
                      p + L.down.weight, N, I, h);
  a.mlp_act.reset();
  TrackedBuffer<S> d_attn_out;  // [N, qw/t]
  auto output_projection_backward = [&](const S* d_out) {
    d_attn_out = activation(N * qw);
    be_.linear_backward(d_attn_out.data(), g + L.o.weight, at(g, L.o.bias), d_out,
                        a.attn_out.data(), p + L.o.weight, N, qw, h);
    if (!options_.flash_attention) a.attn_out.reset();  // flash's backward reads it again
  };
  if (m.parallel_residual) output_projection_backward(dy_all);
  dy_gathered.reset();
  auto d_norm2 = mlp_backward_tp(p, g, a, std::move(d_act));
  const S* mlp_in = m.parallel_residual ? a.input.data() : a.mid.data();
  norm_backward(n, dy.data(), g, d_norm2.data(), mlp_in, p, L.norm2, a.norm2_mean, a.norm2_rstd);
  d_norm2.reset();
  a.mid.reset();
  a.norm2_mean.reset();
  a.norm2_rstd.reset();
  if (!m.parallel_residual) {
    const S* d_mid = column_input(dy, a.shape, dy_gathered);
    output_projection_backward(d_mid);
    dy_gathered.reset();
  }
  auto d_norm1 = attention_backward_tp(p, g, a, std::move(d_attn_out));
  norm_backward(n, dy.data(), g, d_norm1.data(), a.input.data(), p, L.norm1, a.norm1_mean,
                a.norm1_rstd);
  return dy;
}

// S is a type: bugprone-macro-parentheses asks for "(S)*", which is not a type.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define SHARDPLAN_TP_INSTANTIATE(S)                                                                \
  template bool GptModel<S>::sequence_parallel() const;                                            \
  template std::int64_t GptModel<S>::local_tokens(BatchShape) const;                               \
  template TrackedBuffer<S> GptModel<S>::gather_tokens(const S*, BatchShape) const;                \
  template TrackedBuffer<S> GptModel<S>::reduce_tokens(TrackedBuffer<S>, BatchShape) const;        \
  template void GptModel<S>::run_block_tp(const S*, BlockActivations<S>&, TrackedBuffer<S>&)       \
      const;                                                                                       \
  template TrackedBuffer<S> GptModel<S>::backward_block_tp(const S*, BlockActivations<S>&,         \
                                                           TrackedBuffer<S>, S*) const;            \
  template const S* GptModel<S>::column_input(const TrackedBuffer<S>&, BatchShape,                 \
                                              TrackedBuffer<S>&) const;                            \
  template void GptModel<S>::attention_forward_tp(const S*, BlockActivations<S>&, const S*) const; \
  template void GptModel<S>::mlp_forward_tp(const S*, BlockActivations<S>&, const S*) const;       \
  template TrackedBuffer<S> GptModel<S>::attention_backward_tp(const S*, S*, BlockActivations<S>&, \
                                                               TrackedBuffer<S>) const;            \
  template TrackedBuffer<S> GptModel<S>::mlp_backward_tp(const S*, S*, BlockActivations<S>&,       \
                                                         TrackedBuffer<S>) const;
// NOLINTEND(bugprone-macro-parentheses)

SHARDPLAN_TP_INSTANTIATE(float)
SHARDPLAN_TP_INSTANTIATE(double)
SHARDPLAN_TP_INSTANTIATE(bf16)
SHARDPLAN_TP_INSTANTIATE(f16)
#undef SHARDPLAN_TP_INSTANTIATE

}  // namespace shardplan::executor
