// The embedding and the head of GptModel under tensor parallelism (tensor_parallel.hpp): a
// vocabulary-parallel embedding and a vocabulary-parallel cross-entropy over this rank's V/t rows
// of the token table and of the output matrix, after Megatron-LM's VocabParallelEmbedding and
// vocab_parallel_cross_entropy (megatron/core/tensor_parallel/layers.py, cross_entropy.py).
// N = B·T tokens, n = local_tokens() (N/t under sequence parallelism), Vt = V/t. Shapes:
//   embedding output   [N, h] partial (this rank's tokens' rows) → summed: [n, h]
//   logits [N, Vt] (S), log_probs [N, Vt] (accum_t<S>), row statistics max, sum [N] (accum_t<S>)
#include "executor/gpt_model.hpp"
#include "kernels/scalar.hpp"

namespace shardplan::executor {

using kernels::bf16;
using kernels::data_type_v;
using kernels::f16;
namespace {}  // namespace

template <class S> std::int64_t GptModel<S>::vocab_begin() const {
  return options_.tensor_parallel.rank() * layout_.spec().vocab;
}

// The rows of this rank's tokens (0 for the others; TP rank 0 adds the learned positions), summed
// over the group: all-reduced [N, h], or reduce-scattered to this rank's [N/t, h].
template <class S>
TrackedBuffer<S> GptModel<S>::forward_embedding_tp(const S* params,
                                                   std::span<const std::int32_t> tokens,
                                                   BatchShape shape) const {
  const auto& m = layout_.spec();
  const auto& e = layout_.embedding();
  const bool first = options_.tensor_parallel.rank() == 0;
  auto partial = written_activation(shape.tokens() * m.hidden);  // [N, h]
  be_.vocab_embedding_forward(partial.data(), tokens.data(), params + e.tokens,
                              first ? at(params, e.positions) : nullptr, vocab_begin(), m.vocab,
                              shape.batch, shape.seq, m.hidden);
  return reduce_tokens(std::move(partial), shape);
}

// Loss over this rank's logits: Σ over the N tokens of −log p(target), the same on every rank.
template <class S>
double GptModel<S>::vocab_parallel_loss(HeadActivations<S>& a,
                                        std::span<const std::int32_t> targets) const {
  auto& g = *options_.tensor_parallel.group;
  const std::int64_t N = a.shape.tokens(), V = layout_.spec().vocab;
  const auto count = static_cast<std::size_t>(N);
  auto max = written_activation<A>(N);  // [N]
  auto sum = written_activation<A>(N);  // [N]
  be_.logits_row_max(max.data(), a.logits.data(), N, V);
  g.all_reduce(max.data(), max.data(), count, data_type_v<A>, comm::ReduceOp::max);
  be_.logits_row_sum_exp(sum.data(), a.logits.data(), max.data(), N, V);
  g.all_reduce(sum.data(), sum.data(), count, data_type_v<A>);
  be_.log_softmax_from_stats(a.log_probs.data(), a.logits.data(), max.data(), sum.data(), N, V);
  double loss = be_.vocab_nll_loss_forward(a.log_probs.data(), targets.data(), vocab_begin(), N, V);
  g.all_reduce(&loss, &loss, 1, comm::DataType::f64);  // each target's term from its owner
  return loss;
}

// d logits [N, Vt] = scale · (softmax − one-hot) on this rank's columns; frees the saved logits
// and log-probabilities.
template <class S>
TrackedBuffer<S> GptModel<S>::vocab_parallel_loss_backward(HeadActivations<S>& a,
                                                           std::span<const std::int32_t> targets,
                                                           double scale) const {
  const std::int64_t N = a.shape.tokens(), V = layout_.spec().vocab;
  auto d_logits = written_activation(N * V);  // [N, Vt]
  be_.vocab_cross_entropy_backward(d_logits.data(), a.log_probs.data(), targets.data(),
                                   vocab_begin(), N, V, static_cast<A>(scale));
  a.log_probs.reset();
  a.logits.reset();
  return d_logits;
}

#define SHARDPLAN_TP_VOCAB_INSTANTIATE(S)                                                          \
  template std::int64_t GptModel<S>::vocab_begin() const;                                          \
  template TrackedBuffer<S> GptModel<S>::forward_embedding_tp(                                     \
      const S*, std::span<const std::int32_t>, BatchShape) const;                                  \
  template double GptModel<S>::vocab_parallel_loss(HeadActivations<S>&,                            \
                                                   std::span<const std::int32_t>) const;           \
  template TrackedBuffer<S> GptModel<S>::vocab_parallel_loss_backward(                             \
      HeadActivations<S>&, std::span<const std::int32_t>, double) const;

SHARDPLAN_TP_VOCAB_INSTANTIATE(float)
SHARDPLAN_TP_VOCAB_INSTANTIATE(double)
SHARDPLAN_TP_VOCAB_INSTANTIATE(bf16)
SHARDPLAN_TP_VOCAB_INSTANTIATE(f16)
#undef SHARDPLAN_TP_VOCAB_INSTANTIATE

}  // namespace shardplan::executor
