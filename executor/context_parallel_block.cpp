// Ring attention over the context-parallel group (context_parallel.hpp): GptModel's attention
// core when each rank holds a share of every sequence. Memory beyond the block's saved tensors
// (what the cost model's executor recipe counts, costmodel/parallel_memory.cpp):
//   forward   the running output [N, q] in accum_t<S>; the keys and values received (k and v,
//             [N, kv] each) and, while the next pair arrives, one more [N, kv]
//   backward  the received keys and values, the dK, dV travelling with them ([N, kv] each, in
//             place of the rank's own, which come home at the end), one more [N, kv] arriving
#include "executor/context_parallel.hpp"
#include "executor/gpt_model.hpp"
#include "kernels/scalar.hpp"

namespace shardplan::executor {

using kernels::bf16;
using kernels::data_type_v;
using kernels::f16;

template <class S> TrackedBuffer<S> GptModel<S>::ring_pass(const S* send, std::int64_t n) const {
  auto& g = *options_.context_parallel.group;
  const int c = g.size(), r = g.rank();
  auto received = written_activation(n);
  g.send_recv(send, static_cast<std::size_t>(n), (r + 1) % c, received.data(),
              static_cast<std::size_t>(n), (r + c - 1) % c, data_type_v<S>);
  return received;
}

template <class S> void GptModel<S>::ring_attention_forward(BlockActivations<S>& a) const {
  const auto& m = layout_.spec();
  const int c = options_.context_parallel.size(), r = options_.context_parallel.rank();
  const std::int64_t B = a.shape.batch, T = a.shape.seq, N = a.shape.tokens();
  const std::int64_t qw = m.q_width(), kw = m.kv_width();
  const auto mine = context_positions(T * c, c, r);
  be_.rope_at(a.q.data(), mine.data(), B, T, m.heads, m.head_dim, options_.rope_theta, false);
  be_.rope_at(a.k.data(), mine.data(), B, T, m.kv_heads, m.head_dim, options_.rope_theta, false);
  a.lse = written_activation<A>(B * m.heads * T);  // [B, a, T]
  auto out = written_activation<A>(N * qw);        // [N, q] the running output
  TrackedBuffer<S> k, v;                           // [N, kv] another rank's, once received
  for (int i = 0; i < c; ++i) {
    const auto theirs = context_positions(T * c, c, (r - i + c) % c);
    be_.flash_attention_forward_at(out.data(), a.lse.data(), a.q.data(),
                                   i == 0 ? a.k.data() : k.data(), i == 0 ? a.v.data() : v.data(),
                                   {mine.data(), T, theirs.data(), T}, i == 0, B, m.heads,
                                   m.kv_heads, m.head_dim);
    if (i + 1 == c) break;
    k = ring_pass(i == 0 ? a.k.data() : k.data(), N * kw);
    v = ring_pass(i == 0 ? a.v.data() : v.data(), N * kw);
  }
  k.reset();
  v.reset();
  a.attn_out = written_activation(N * qw);
  be_.narrow(a.attn_out.data(), out.data(), N * qw);
}

template <class S>
void GptModel<S>::ring_attention_backward(BlockActivations<S>& a, const S* d_attn_out,
                                          TrackedBuffer<S>& dq, TrackedBuffer<S>& dk,
                                          TrackedBuffer<S>& dv) const {
  const auto& m = layout_.spec();
  const int c = options_.context_parallel.size(), r = options_.context_parallel.rank();
  const std::int64_t B = a.shape.batch, T = a.shape.seq, N = a.shape.tokens();
  const std::int64_t kw = m.kv_width();
  const auto mine = context_positions(T * c, c, r);
  auto delta = written_activation<A>(B * m.heads * T);  // [B, a, T] rowsum(dO ∘ O)
  TrackedBuffer<S> k, v;  // [N, kv] another rank's, once received; dk, dv travel with them
  for (int i = 0; i < c; ++i) {
    const auto theirs = context_positions(T * c, c, (r - i + c) % c);
    be_.flash_attention_backward_at(
        dq.data(), dk.data(), dv.data(), delta.data(), d_attn_out, a.attn_out.data(), a.lse.data(),
        a.q.data(), i == 0 ? a.k.data() : k.data(), i == 0 ? a.v.data() : v.data(),
        {mine.data(), T, theirs.data(), T}, B, m.heads, m.kv_heads, m.head_dim);
    if (i + 1 == c) break;
    k = ring_pass(i == 0 ? a.k.data() : k.data(), N * kw);
    v = ring_pass(i == 0 ? a.v.data() : v.data(), N * kw);
    dk = ring_pass(dk.data(), N * kw);
    dv = ring_pass(dv.data(), N * kw);
  }
  // dk, dv now hold rank r + 1's keys' gradients, complete: one more hop home.
  k.reset();
  v.reset();
  delta.reset();
  if (c > 1) {
    dk = ring_pass(dk.data(), N * kw);
    dv = ring_pass(dv.data(), N * kw);
  }
}

// S is a type: bugprone-macro-parentheses asks for "(S)*", which is not a type.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define SHARDPLAN_CP_INSTANTIATE(S)                                                                \
  template TrackedBuffer<S> GptModel<S>::ring_pass(const S*, std::int64_t) const;                  \
  template void GptModel<S>::ring_attention_forward(BlockActivations<S>&) const;                   \
  template void GptModel<S>::ring_attention_backward(BlockActivations<S>&, const S*,               \
                                                     TrackedBuffer<S>&, TrackedBuffer<S>&,         \
                                                     TrackedBuffer<S>&) const;
// NOLINTEND(bugprone-macro-parentheses)

SHARDPLAN_CP_INSTANTIATE(float)
SHARDPLAN_CP_INSTANTIATE(double)
SHARDPLAN_CP_INSTANTIATE(bf16)
SHARDPLAN_CP_INSTANTIATE(f16)
#undef SHARDPLAN_CP_INSTANTIATE

}  // namespace shardplan::executor
