#include "kernels/backend.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <utility>

#include "comm/host_stream.hpp"
#include "kernels/flash_attention_host.hpp"
#include "kernels/host_stream_memory.hpp"
#include "kernels/kernels.hpp"

namespace shardplan::kernels {

template <class S>
void HostBackend<S>::embedding_forward(S* out, const std::int32_t* tokens, const S* wte,
                                       const S* wpe, std::int64_t batch, std::int64_t seq,
                                       std::int64_t channels) {
  kernels::embedding_forward(out, tokens, wte, wpe, batch, seq, channels);
}
template <class S>
void HostBackend<S>::embedding_backward(S* dwte, S* dwpe, const S* dout, const std::int32_t* tokens,
                                        std::int64_t batch, std::int64_t seq,
                                        std::int64_t channels) {
  kernels::embedding_backward(dwte, dwpe, dout, tokens, batch, seq, channels);
}
template <class S>
void HostBackend<S>::linear_forward(S* y, const S* x, const S* w, const S* b, std::int64_t n,
                                    std::int64_t in, std::int64_t out, bool accumulate) {
  kernels::linear_forward(y, x, w, b, n, in, out, accumulate);
}
template <class S>
void HostBackend<S>::linear_backward(S* dx, S* dw, S* db, const S* dy, const S* x, const S* w,
                                     std::int64_t n, std::int64_t in, std::int64_t out) {
  kernels::linear_backward(dx, dw, db, dy, x, w, n, in, out);
}
template <class S>
void HostBackend<S>::layernorm_forward(S* y, A* mean, A* rstd, const S* x, const S* w, const S* b,
                                       std::int64_t n, std::int64_t channels, A eps) {
  kernels::layernorm_forward(y, mean, rstd, x, w, b, n, channels, eps);
}
template <class S>
void HostBackend<S>::layernorm_backward(S* dx, S* dw, S* db, const S* dy, const S* x, const S* w,
                                        const A* mean, const A* rstd, std::int64_t n,
                                        std::int64_t channels) {
  kernels::layernorm_backward(dx, dw, db, dy, x, w, mean, rstd, n, channels);
}
template <class S>
void HostBackend<S>::rmsnorm_forward(S* y, A* rstd, const S* x, const S* w, std::int64_t n,
                                     std::int64_t channels, A eps) {
  kernels::rmsnorm_forward(y, rstd, x, w, n, channels, eps);
}
template <class S>
void HostBackend<S>::rmsnorm_backward(S* dx, S* dw, const S* dy, const S* x, const S* w,
                                      const A* rstd, std::int64_t n, std::int64_t channels) {
  kernels::rmsnorm_backward(dx, dw, dy, x, w, rstd, n, channels);
}
template <class S>
void HostBackend<S>::rope_forward(S* x, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                                  std::int64_t head_dim, double theta) {
  kernels::rope_forward(x, batch, seq, heads, head_dim, theta);
}
template <class S>
void HostBackend<S>::rope_backward(S* dx, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                                   std::int64_t head_dim, double theta) {
  kernels::rope_backward(dx, batch, seq, heads, head_dim, theta);
}
template <class S>
void HostBackend<S>::attention_forward(S* out, S* probs, const S* q, const S* k, const S* v,
                                       std::int64_t batch, std::int64_t seq, std::int64_t heads,
                                       std::int64_t kv_heads, std::int64_t head_dim) {
  kernels::attention_forward(out, probs, q, k, v, batch, seq, heads, kv_heads, head_dim);
}
template <class S>
std::int64_t HostBackend<S>::attention_scratch_elements(std::int64_t, std::int64_t seq,
                                                        std::int64_t) const {
  return seq * seq;
}
template <class S>
void HostBackend<S>::attention_backward(S* dq, S* dk, S* dv, S* scratch, const S* dout,
                                        const S* probs, const S* q, const S* k, const S* v,
                                        std::int64_t batch, std::int64_t seq, std::int64_t heads,
                                        std::int64_t kv_heads, std::int64_t head_dim) {
  kernels::attention_backward(dq, dk, dv, scratch, dout, probs, q, k, v, batch, seq, heads,
                              kv_heads, head_dim);
}
template <class S>
void HostBackend<S>::flash_attention_forward(S* out, A* lse, const S* q, const S* k, const S* v,
                                             std::int64_t batch, std::int64_t seq,
                                             std::int64_t heads, std::int64_t kv_heads,
                                             std::int64_t head_dim) {
  flash_host::forward(out, lse, q, k, v, batch, seq, heads, kv_heads, head_dim);
}
template <class S>
void HostBackend<S>::flash_attention_backward(S* dq, S* dk, S* dv, A* delta, const S* dout,
                                              const S* out, const A* lse, const S* q, const S* k,
                                              const S* v, std::int64_t batch, std::int64_t seq,
                                              std::int64_t heads, std::int64_t kv_heads,
                                              std::int64_t head_dim) {
  flash_host::backward(dq, dk, dv, delta, dout, out, lse, q, k, v, batch, seq, heads, kv_heads,
                       head_dim);
}
template <class S>
void HostBackend<S>::rope_at(S* x, const std::int32_t* positions, std::int64_t batch,
                             std::int64_t seq, std::int64_t heads, std::int64_t head_dim,
                             double theta, bool backward) {
  if (backward)
    kernels::rope_backward(x, batch, seq, heads, head_dim, theta, positions);
  else
    kernels::rope_forward(x, batch, seq, heads, head_dim, theta, positions);
}
template <class S>
void HostBackend<S>::flash_attention_forward_at(A* out_acc, A* lse, const S* q, const S* k,
                                                const S* v, flash_host::Positions at, bool first,
                                                std::int64_t batch, std::int64_t heads,
                                                std::int64_t kv_heads, std::int64_t head_dim) {
  flash_host::forward_at(out_acc, lse, q, k, v, at, first, batch, heads, kv_heads, head_dim);
}
template <class S>
void HostBackend<S>::flash_attention_backward_at(S* dq, S* dk, S* dv, A* delta, const S* dout,
                                                 const S* out, const A* lse, const S* q, const S* k,
                                                 const S* v, flash_host::Positions at,
                                                 std::int64_t batch, std::int64_t heads,
                                                 std::int64_t kv_heads, std::int64_t head_dim) {
  flash_host::backward_at(dq, dk, dv, delta, dout, out, lse, q, k, v, at, batch, heads, kv_heads,
                          head_dim);
}
template <class S> void HostBackend<S>::gelu_forward(S* out, const S* in, std::int64_t n) {
  kernels::gelu_forward(out, in, n);
}
template <class S>
void HostBackend<S>::gelu_backward(S* din, const S* in, const S* dout, std::int64_t n) {
  kernels::gelu_backward(din, in, dout, n);
}
template <class S>
void HostBackend<S>::swiglu_forward(S* out, const S* gate, const S* up, std::int64_t n) {
  kernels::swiglu_forward(out, gate, up, n);
}
template <class S>
void HostBackend<S>::swiglu_backward(S* dgate, S* dup, const S* dout, const S* gate, const S* up,
                                     std::int64_t n) {
  kernels::swiglu_backward(dgate, dup, dout, gate, up, n);
}
template <class S>
void HostBackend<S>::log_softmax_forward(A* logp, const S* logits, std::int64_t n,
                                         std::int64_t vocab) {
  kernels::log_softmax_forward(logp, logits, n, vocab);
}
template <class S>
double HostBackend<S>::nll_loss_forward(const A* logp, const std::int32_t* targets, std::int64_t n,
                                        std::int64_t vocab) {
  return kernels::nll_loss_forward<S>(logp, targets, n, vocab);
}
template <class S>
void HostBackend<S>::nll_loss_backward(A* dlogp, const std::int32_t* targets, std::int64_t n,
                                       std::int64_t vocab, A scale) {
  kernels::nll_loss_backward<S>(dlogp, targets, n, vocab, scale);
}
template <class S>
void HostBackend<S>::log_softmax_backward(S* dlogits, const A* dlogp, const A* logp, std::int64_t n,
                                          std::int64_t vocab) {
  kernels::log_softmax_backward(dlogits, dlogp, logp, n, vocab);
}
template <class S>
void HostBackend<S>::vocab_embedding_forward(S* out, const std::int32_t* tokens, const S* wte,
                                             const S* wpe, std::int64_t begin, std::int64_t rows,
                                             std::int64_t batch, std::int64_t seq,
                                             std::int64_t channels) {
  kernels::vocab_embedding_forward(out, tokens, wte, wpe, begin, rows, batch, seq, channels);
}
template <class S>
void HostBackend<S>::vocab_embedding_backward(S* dwte, S* dwpe, const S* dout,
                                              const std::int32_t* tokens, std::int64_t begin,
                                              std::int64_t rows, std::int64_t batch,
                                              std::int64_t seq, std::int64_t channels) {
  kernels::vocab_embedding_backward(dwte, dwpe, dout, tokens, begin, rows, batch, seq, channels);
}
template <class S>
void HostBackend<S>::logits_row_max(A* max, const S* logits, std::int64_t n, std::int64_t vocab) {
  kernels::logits_row_max(max, logits, n, vocab);
}
template <class S>
void HostBackend<S>::logits_row_sum_exp(A* sum, const S* logits, const A* max, std::int64_t n,
                                        std::int64_t vocab) {
  kernels::logits_row_sum_exp(sum, logits, max, n, vocab);
}
template <class S>
void HostBackend<S>::log_softmax_from_stats(A* logp, const S* logits, const A* max, const A* sum,
                                            std::int64_t n, std::int64_t vocab) {
  kernels::log_softmax_from_stats(logp, logits, max, sum, n, vocab);
}
template <class S>
double HostBackend<S>::vocab_nll_loss_forward(const A* logp, const std::int32_t* targets,
                                              std::int64_t begin, std::int64_t n,
                                              std::int64_t vocab) {
  return kernels::vocab_nll_loss_forward<S>(logp, targets, begin, n, vocab);
}
template <class S>
void HostBackend<S>::vocab_cross_entropy_backward(S* dlogits, const A* logp,
                                                  const std::int32_t* targets, std::int64_t begin,
                                                  std::int64_t n, std::int64_t vocab, A scale) {
  kernels::vocab_cross_entropy_backward<S>(dlogits, logp, targets, begin, n, vocab, scale);
}
template <class S> void HostBackend<S>::copy(S* dst, const S* src, std::int64_t n) {
  std::copy(src, src + n, dst);
}
template <class S> void HostBackend<S>::add(S* dst, const S* src, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] = kernels::narrow<S>(widen(dst[i]) + widen(src[i]));
}
template <class S>
void HostBackend<S>::adamw_step(A* params, const A* grads, A* exp_avg, A* exp_avg_sq,
                                std::int64_t n, std::int64_t step, const AdamWOptions& options) {
  const auto count = static_cast<std::size_t>(n);
  kernels::adamw_step<A>({params, count}, {grads, count}, {exp_avg, count}, {exp_avg_sq, count},
                         step, options);
}
template <class S> void HostBackend<S>::narrow(S* dst, const A* src, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] = kernels::narrow<S>(src[i]);
}
template <class S> void HostBackend<S>::widen_add(A* dst, const S* src, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] += widen(src[i]);
}
template <class S> void HostBackend<S>::copy_wide(A* dst, const A* src, std::int64_t n) {
  std::copy(src, src + n, dst);
}
template <class S> void HostBackend<S>::scale(A* x, std::int64_t n, double factor) {
  const auto f = static_cast<A>(factor);
  for (std::int64_t i = 0; i < n; ++i) x[i] *= f;
}
template <class S> bool HostBackend<S>::all_finite(const A* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) return false;
  return true;
}
template <class S>
HostBackend<S>::HostBackend(MemorySource* memory)
    : memory_(dynamic_cast<StreamOrderedHostMemory*>(memory)) {}

namespace {
comm::HostStream* host_stream_of(comm::Communicator* c) {
  return c != nullptr ? c->host_stream() : nullptr;
}
}  // namespace

template <class S>
void HostBackend<S>::wait(comm::Communicator* waiter, comm::Communicator* producer) {
  auto* p = host_stream_of(producer);
  if (p == nullptr) return;  // the computing thread, or a blocking group: what they issued is done
  auto* w = host_stream_of(waiter);
  if (w != nullptr) {
    w->enqueue_wait(*p, p->queued());
    return;
  }
  // The computing thread waits (for itself, or for a blocking group whose calls it makes).
  const auto t0 = std::chrono::steady_clock::now();
  p->wait_for(p->queued());
  seconds_.comm_waits[producer] +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

template <class S> void HostBackend<S>::record_use(const void* p, comm::Communicator* user) {
  auto* s = host_stream_of(user);
  if (s == nullptr) return;
  if (memory_ != nullptr)
    memory_->record_use(p, s);
  else
    s->wait_for(s->queued());  // nothing holds the memory back: it must be done with it now
}

template <class S> void HostBackend<S>::allocate_on(comm::Communicator* stream) {
  if (memory_ != nullptr) memory_->set_stream(host_stream_of(stream));
}

template <class S> void HostBackend<S>::begin(typename Backend<S>::Part part) {
  started_[static_cast<int>(part)] = std::chrono::steady_clock::now();
}
template <class S> void HostBackend<S>::end(typename Backend<S>::Part part) {
  using P = typename Backend<S>::Part;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                                 started_[static_cast<int>(part)])
                       .count();
  switch (part) {
  case P::forward:
    seconds_.forward += s;
    break;
  case P::backward:
    seconds_.backward += s;
    break;
  case P::optimizer:
    seconds_.optimizer += s;
    break;
  case P::copy:
    seconds_.copy += s;
    break;
  }
}
template <class S> typename Backend<S>::PartSeconds HostBackend<S>::take_seconds() {
  return std::exchange(seconds_, {});
}

template class HostBackend<float>;
template class HostBackend<double>;
template class HostBackend<bf16>;
template class HostBackend<f16>;

}  // namespace shardplan::kernels
