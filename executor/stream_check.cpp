#include "executor/stream_check.hpp"
#include "kernels/adamw.hpp"
#include "kernels/backend.hpp"
#include "kernels/scalar.hpp"

#include <fmt/format.h>

namespace shardplan::executor {

using kernels::AdamWOptions;
using kernels::Backend;
using kernels::bf16;
using kernels::f16;

// ---- CheckedMemory

CheckedMemory::~CheckedMemory() {
  for (auto [p, bytes] : quarantine_) heap_.free(p, bytes);
}

void* CheckedMemory::allocate(std::int64_t bytes, bool zero) {
  void* p = heap_.allocate(bytes, zero);
  checker_.allocated(p, bytes, stream_, fmt::format("block #{} ({} bytes)", ++count_, bytes));
  return p;
}

void CheckedMemory::free(void* data, std::int64_t bytes) noexcept {
  checker_.freed(data);
  quarantine_.emplace_back(data, bytes);
}

void CheckedMemory::write(void* dst, const void* host, std::int64_t bytes) {
  checker_.write(stream_, dst, bytes, "host-to-device copy");
  checker_.host_waits(stream_);
  heap_.write(dst, host, bytes);
}

void CheckedMemory::read(void* host, const void* src, std::int64_t bytes) {
  checker_.read(stream_, src, bytes, "device-to-host copy");
  checker_.host_waits(stream_);
  heap_.read(host, src, bytes);
}

void CheckedMemory::copy(void* dst, const void* src, std::int64_t bytes) {
  checker_.read(stream_, src, bytes, "device copy");
  checker_.write(stream_, dst, bytes, "device copy");
  heap_.copy(dst, src, bytes);
}

// ---- CheckedCommunicator

CheckedCommunicator::CheckedCommunicator(comm::Communicator& inner, StreamOrderChecker& checker,
                                         std::string name)
    : ForwardingCommunicator(inner), checker_(checker) {
  checker_.name_stream(this, std::move(name));
}

void CheckedCommunicator::access(const void* send, std::int64_t send_bytes, const void* recv,
                                 std::int64_t recv_bytes, const char* what) {
  // In place (send inside recv) is one write of recv.
  const auto* s = static_cast<const char*>(send);
  const auto* r = static_cast<const char*>(recv);
  const bool in_place = r != nullptr && s >= r && s + send_bytes <= r + recv_bytes;
  if (!in_place) checker_.read(this, send, send_bytes, what);
  checker_.write(this, recv, recv_bytes, what);
}

namespace {
std::int64_t bytes_of(std::size_t count, comm::DataType type) {
  return static_cast<std::int64_t>(count * comm::element_bytes(type));
}
}  // namespace

void CheckedCommunicator::do_all_reduce(const void* send, void* recv, std::size_t count,
                                        comm::DataType type, comm::ReduceOp op) {
  access(send, bytes_of(count, type), recv, bytes_of(count, type), "all-reduce");
  inner_.all_reduce(send, recv, count, type, op);
}

void CheckedCommunicator::do_reduce(const void* send, void* recv, std::size_t count,
                                    comm::DataType type, int root, comm::ReduceOp op) {
  access(send, bytes_of(count, type), rank() == root ? recv : nullptr, bytes_of(count, type),
         "reduce");
  inner_.reduce(send, recv, count, type, root, op);
}

void CheckedCommunicator::all_gather(const void* send, void* recv, std::size_t count,
                                     comm::DataType type) {
  access(send, bytes_of(count, type), recv,
         bytes_of(count * static_cast<std::size_t>(size()), type), "all-gather");
  inner_.all_gather(send, recv, count, type);
}

void CheckedCommunicator::do_reduce_scatter(const void* send, void* recv, std::size_t count,
                                            comm::DataType type, comm::ReduceOp op) {
  access(send, bytes_of(count * static_cast<std::size_t>(size()), type), recv,
         bytes_of(count, type), "reduce-scatter");
  inner_.reduce_scatter(send, recv, count, type, op);
}

void CheckedCommunicator::broadcast(void* buffer, std::size_t count, comm::DataType type,
                                    int root) {
  checker_.write(this, buffer, bytes_of(count, type), "broadcast");
  inner_.broadcast(buffer, count, type, root);
}

void CheckedCommunicator::all_to_all(const void* send, void* recv, std::size_t count,
                                     comm::DataType type) {
  const auto n = static_cast<std::size_t>(size());
  access(send, bytes_of(count * n, type), recv, bytes_of(count * n, type), "all-to-all");
  inner_.all_to_all(send, recv, count, type);
}

void CheckedCommunicator::synchronize() {
  inner_.synchronize();
  checker_.host_waits(this);
}

// ---- CheckedBackend

template <class S>
CheckedBackend<S>::CheckedBackend(Backend<S>& inner, StreamOrderChecker& checker,
                                  CheckedMemory& memory)
    : inner_(inner), checker_(checker), memory_(memory) {
  checker_.name_stream(compute(), "compute");
  memory_.set_stream(compute());
}

template <class S>
StreamOrderChecker::Stream CheckedBackend<S>::stream_of(const comm::Communicator* c) const {
  if (c == nullptr || c->stream_handle() == nullptr) return compute();
  return c->stream_handle();
}

template <class S>
void CheckedBackend<S>::embedding_forward(S* out, const std::int32_t* tokens, const S* wte,
                                          const S* wpe, std::int64_t batch, std::int64_t seq,
                                          std::int64_t channels) {
  const std::int64_t n = batch * seq;
  r(tokens, n, "embedding forward");
  r(wte, -1, "embedding forward");  // the rows the tokens name
  r(wpe, seq * channels, "embedding forward");
  w(out, n * channels, "embedding forward");
  inner_.embedding_forward(out, tokens, wte, wpe, batch, seq, channels);
}

template <class S>
void CheckedBackend<S>::embedding_backward(S* dwte, S* dwpe, const S* dout,
                                           const std::int32_t* tokens, std::int64_t batch,
                                           std::int64_t seq, std::int64_t channels) {
  const std::int64_t n = batch * seq;
  r(dout, n * channels, "embedding backward");
  r(tokens, n, "embedding backward");
  w(dwte, -1, "embedding backward");
  w(dwpe, seq * channels, "embedding backward");
  inner_.embedding_backward(dwte, dwpe, dout, tokens, batch, seq, channels);
}

template <class S>
void CheckedBackend<S>::linear_forward(S* y, const S* x, const S* wt, const S* b, std::int64_t n,
                                       std::int64_t in, std::int64_t out, bool accumulate) {
  r(x, n * in, "linear forward");
  r(wt, out * in, "linear forward");
  r(b, out, "linear forward");
  w(y, n * out, "linear forward");
  inner_.linear_forward(y, x, wt, b, n, in, out, accumulate);
}

template <class S>
void CheckedBackend<S>::linear_backward(S* dx, S* dw, S* db, const S* dy, const S* x, const S* wt,
                                        std::int64_t n, std::int64_t in, std::int64_t out) {
  r(dy, n * out, "linear backward");
  r(x, n * in, "linear backward");
  r(wt, out * in, "linear backward");
  w(dx, n * in, "linear backward");
  w(dw, out * in, "linear backward");
  w(db, out, "linear backward");
  inner_.linear_backward(dx, dw, db, dy, x, wt, n, in, out);
}

template <class S>
void CheckedBackend<S>::layernorm_forward(S* y, A* mean, A* rstd, const S* x, const S* wt,
                                          const S* b, std::int64_t n, std::int64_t channels,
                                          A eps) {
  r(x, n * channels, "layernorm forward");
  r(wt, channels, "layernorm forward");
  r(b, channels, "layernorm forward");
  w(y, n * channels, "layernorm forward");
  w(mean, n, "layernorm forward");
  w(rstd, n, "layernorm forward");
  inner_.layernorm_forward(y, mean, rstd, x, wt, b, n, channels, eps);
}

template <class S>
void CheckedBackend<S>::layernorm_backward(S* dx, S* dw, S* db, const S* dy, const S* x,
                                           const S* wt, const A* mean, const A* rstd,
                                           std::int64_t n, std::int64_t channels) {
  r(dy, n * channels, "layernorm backward");
  r(x, n * channels, "layernorm backward");
  r(wt, channels, "layernorm backward");
  r(mean, n, "layernorm backward");
  r(rstd, n, "layernorm backward");
  w(dx, n * channels, "layernorm backward");
  w(dw, channels, "layernorm backward");
  w(db, channels, "layernorm backward");
  inner_.layernorm_backward(dx, dw, db, dy, x, wt, mean, rstd, n, channels);
}

template <class S>
void CheckedBackend<S>::rmsnorm_forward(S* y, A* rstd, const S* x, const S* wt, std::int64_t n,
                                        std::int64_t channels, A eps) {
  r(x, n * channels, "rmsnorm forward");
  r(wt, channels, "rmsnorm forward");
  w(y, n * channels, "rmsnorm forward");
  w(rstd, n, "rmsnorm forward");
  inner_.rmsnorm_forward(y, rstd, x, wt, n, channels, eps);
}

template <class S>
void CheckedBackend<S>::rmsnorm_backward(S* dx, S* dw, const S* dy, const S* x, const S* wt,
                                         const A* rstd, std::int64_t n, std::int64_t channels) {
  r(dy, n * channels, "rmsnorm backward");
  r(x, n * channels, "rmsnorm backward");
  r(wt, channels, "rmsnorm backward");
  r(rstd, n, "rmsnorm backward");
  w(dx, n * channels, "rmsnorm backward");
  w(dw, channels, "rmsnorm backward");
  inner_.rmsnorm_backward(dx, dw, dy, x, wt, rstd, n, channels);
}

template <class S>
void CheckedBackend<S>::rope_forward(S* x, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                                     std::int64_t head_dim, double theta) {
  w(x, batch * seq * heads * head_dim, "rotary forward");
  inner_.rope_forward(x, batch, seq, heads, head_dim, theta);
}

template <class S>
void CheckedBackend<S>::rope_backward(S* dx, std::int64_t batch, std::int64_t seq,
                                      std::int64_t heads, std::int64_t head_dim, double theta) {
  w(dx, batch * seq * heads * head_dim, "rotary backward");
  inner_.rope_backward(dx, batch, seq, heads, head_dim, theta);
}

template <class S>
void CheckedBackend<S>::attention_forward(S* out, S* probs, const S* q, const S* k, const S* v,
                                          std::int64_t batch, std::int64_t seq, std::int64_t heads,
                                          std::int64_t kv_heads, std::int64_t head_dim) {
  const std::int64_t n = batch * seq;
  r(q, n * heads * head_dim, "attention forward");
  r(k, n * kv_heads * head_dim, "attention forward");
  r(v, n * kv_heads * head_dim, "attention forward");
  w(out, n * heads * head_dim, "attention forward");
  w(probs, batch * heads * seq * seq, "attention forward");
  inner_.attention_forward(out, probs, q, k, v, batch, seq, heads, kv_heads, head_dim);
}

template <class S>
void CheckedBackend<S>::attention_backward(S* dq, S* dk, S* dv, S* scratch, const S* dout,
                                           const S* probs, const S* q, const S* k, const S* v,
                                           std::int64_t batch, std::int64_t seq, std::int64_t heads,
                                           std::int64_t kv_heads, std::int64_t head_dim) {
  const std::int64_t n = batch * seq;
  r(dout, n * heads * head_dim, "attention backward");
  r(probs, batch * heads * seq * seq, "attention backward");
  r(q, n * heads * head_dim, "attention backward");
  r(k, n * kv_heads * head_dim, "attention backward");
  r(v, n * kv_heads * head_dim, "attention backward");
  w(scratch, inner_.attention_scratch_elements(batch, seq, heads), "attention backward");
  w(dq, n * heads * head_dim, "attention backward");
  w(dk, n * kv_heads * head_dim, "attention backward");
  w(dv, n * kv_heads * head_dim, "attention backward");
  inner_.attention_backward(dq, dk, dv, scratch, dout, probs, q, k, v, batch, seq, heads, kv_heads,
                            head_dim);
}

template <class S>
void CheckedBackend<S>::flash_attention_forward(S* out, A* lse, const S* q, const S* k, const S* v,
                                                std::int64_t batch, std::int64_t seq,
                                                std::int64_t heads, std::int64_t kv_heads,
                                                std::int64_t head_dim) {
  const std::int64_t n = batch * seq;
  r(q, n * heads * head_dim, "flash attention forward");
  r(k, n * kv_heads * head_dim, "flash attention forward");
  r(v, n * kv_heads * head_dim, "flash attention forward");
  w(out, n * heads * head_dim, "flash attention forward");
  w(lse, batch * heads * seq, "flash attention forward");
  inner_.flash_attention_forward(out, lse, q, k, v, batch, seq, heads, kv_heads, head_dim);
}

template <class S>
void CheckedBackend<S>::flash_attention_backward(S* dq, S* dk, S* dv, A* delta, const S* dout,
                                                 const S* out, const A* lse, const S* q, const S* k,
                                                 const S* v, std::int64_t batch, std::int64_t seq,
                                                 std::int64_t heads, std::int64_t kv_heads,
                                                 std::int64_t head_dim) {
  const std::int64_t n = batch * seq;
  r(dout, n * heads * head_dim, "flash attention backward");
  r(out, n * heads * head_dim, "flash attention backward");
  r(lse, batch * heads * seq, "flash attention backward");
  r(q, n * heads * head_dim, "flash attention backward");
  r(k, n * kv_heads * head_dim, "flash attention backward");
  r(v, n * kv_heads * head_dim, "flash attention backward");
  w(delta, batch * heads * seq, "flash attention backward");
  w(dq, n * heads * head_dim, "flash attention backward");
  w(dk, n * kv_heads * head_dim, "flash attention backward");
  w(dv, n * kv_heads * head_dim, "flash attention backward");
  inner_.flash_attention_backward(dq, dk, dv, delta, dout, out, lse, q, k, v, batch, seq, heads,
                                  kv_heads, head_dim);
}

template <class S> void CheckedBackend<S>::gelu_forward(S* out, const S* in, std::int64_t n) {
  r(in, n, "gelu forward");
  w(out, n, "gelu forward");
  inner_.gelu_forward(out, in, n);
}

template <class S>
void CheckedBackend<S>::gelu_backward(S* din, const S* in, const S* dout, std::int64_t n) {
  r(in, n, "gelu backward");
  r(dout, n, "gelu backward");
  w(din, n, "gelu backward");
  inner_.gelu_backward(din, in, dout, n);
}

template <class S>
void CheckedBackend<S>::swiglu_forward(S* out, const S* gate, const S* up, std::int64_t n) {
  r(gate, n, "swiglu forward");
  r(up, n, "swiglu forward");
  w(out, n, "swiglu forward");
  inner_.swiglu_forward(out, gate, up, n);
}

template <class S>
void CheckedBackend<S>::swiglu_backward(S* dgate, S* dup, const S* dout, const S* gate, const S* up,
                                        std::int64_t n) {
  r(dout, n, "swiglu backward");
  r(gate, n, "swiglu backward");
  r(up, n, "swiglu backward");
  w(dgate, n, "swiglu backward");
  w(dup, n, "swiglu backward");
  inner_.swiglu_backward(dgate, dup, dout, gate, up, n);
}

template <class S>
void CheckedBackend<S>::log_softmax_forward(A* logp, const S* logits, std::int64_t n,
                                            std::int64_t vocab) {
  r(logits, n * vocab, "log-softmax forward");
  w(logp, n * vocab, "log-softmax forward");
  inner_.log_softmax_forward(logp, logits, n, vocab);
}

template <class S>
double CheckedBackend<S>::nll_loss_forward(const A* logp, const std::int32_t* targets,
                                           std::int64_t n, std::int64_t vocab) {
  r(logp, n * vocab, "loss forward");
  r(targets, n, "loss forward");
  checker_.host_waits(compute());  // the loss comes back to the host
  return inner_.nll_loss_forward(logp, targets, n, vocab);
}

template <class S>
void CheckedBackend<S>::nll_loss_backward(A* dlogp, const std::int32_t* targets, std::int64_t n,
                                          std::int64_t vocab, A scale) {
  r(targets, n, "loss backward");
  w(dlogp, n * vocab, "loss backward");
  inner_.nll_loss_backward(dlogp, targets, n, vocab, scale);
}

template <class S>
void CheckedBackend<S>::log_softmax_backward(S* dlogits, const A* dlogp, const A* logp,
                                             std::int64_t n, std::int64_t vocab) {
  r(dlogp, n * vocab, "log-softmax backward");
  r(logp, n * vocab, "log-softmax backward");
  w(dlogits, n * vocab, "log-softmax backward");
  inner_.log_softmax_backward(dlogits, dlogp, logp, n, vocab);
}

template <class S> void CheckedBackend<S>::copy(S* dst, const S* src, std::int64_t n) {
  r(src, n, "copy");
  w(dst, n, "copy");
  inner_.copy(dst, src, n);
}

template <class S> void CheckedBackend<S>::add(S* dst, const S* src, std::int64_t n) {
  r(src, n, "add");
  w(dst, n, "add");
  inner_.add(dst, src, n);
}

template <class S>
void CheckedBackend<S>::adamw_step(A* params, const A* grads, A* exp_avg, A* exp_avg_sq,
                                   std::int64_t n, std::int64_t step, const AdamWOptions& options) {
  r(grads, n, "optimizer step");
  w(params, n, "optimizer step");
  w(exp_avg, n, "optimizer step");
  w(exp_avg_sq, n, "optimizer step");
  inner_.adamw_step(params, grads, exp_avg, exp_avg_sq, n, step, options);
}

template <class S> void CheckedBackend<S>::narrow(S* dst, const A* src, std::int64_t n) {
  r(src, n, "narrowing copy");
  w(dst, n, "narrowing copy");
  inner_.narrow(dst, src, n);
}

template <class S> void CheckedBackend<S>::widen_add(A* dst, const S* src, std::int64_t n) {
  r(src, n, "widening add");
  w(dst, n, "widening add");
  inner_.widen_add(dst, src, n);
}

template <class S> void CheckedBackend<S>::copy_wide(A* dst, const A* src, std::int64_t n) {
  r(src, n, "copy");
  w(dst, n, "copy");
  inner_.copy_wide(dst, src, n);
}

template <class S> void CheckedBackend<S>::scale(A* x, std::int64_t n, double factor) {
  w(x, n, "scale");
  inner_.scale(x, n, factor);
}

template <class S> bool CheckedBackend<S>::all_finite(const A* x, std::int64_t n) {
  r(x, n, "finiteness check");
  checker_.host_waits(compute());
  return inner_.all_finite(x, n);
}

template <class S>
void CheckedBackend<S>::wait(comm::Communicator* waiter, comm::Communicator* producer) {
  checker_.wait(stream_of(waiter), stream_of(producer));
  inner_.wait(waiter, producer);
}

template <class S> void CheckedBackend<S>::record_use(const void* p, comm::Communicator* user) {
  checker_.record_use(p, stream_of(user));
  inner_.record_use(p, user);
}

template <class S> void CheckedBackend<S>::allocate_on(comm::Communicator* stream) {
  memory_.set_stream(stream_of(stream));
  inner_.allocate_on(stream);
}

template <class S> void CheckedBackend<S>::synchronize() {
  inner_.synchronize();
  checker_.host_waits(compute());
}

template class CheckedBackend<float>;
template class CheckedBackend<bf16>;
template class CheckedBackend<f16>;

}  // namespace shardplan::executor
