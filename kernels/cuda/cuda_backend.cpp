#include "kernels/cuda/cuda_backend.hpp"

#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "kernels/cuda/flash_attention.hpp"

namespace shardplan::kernels::cuda {
namespace {

void check(cudaError_t code, const char* call) {
  if (code != cudaSuccess)
    throw std::runtime_error(
        fmt::format("{} failed: {}: {}", call, cudaGetErrorName(code), cudaGetErrorString(code)));
}

void check(cublasStatus_t code, const char* call) {
  if (code != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(
        fmt::format("{} failed: cuBLAS status {}", call, static_cast<int>(code)));
}

#define CUDA_OK(call) check(call, #call)

}  // namespace

template <class S> CudaBackend<S>::CudaBackend(DeviceMemory& memory, bool tf32) : memory_(memory) {
  CUDA_OK(cudaStreamCreateWithFlags(&launch_.stream, cudaStreamNonBlocking));
  CUDA_OK(cublasCreate(&launch_.blas));
  CUDA_OK(cublasSetStream(launch_.blas, launch_.stream));
  set_tf32(launch_.blas, tf32);
  // The loss accumulator: 8 bytes outside the tracked allocator, like cuBLAS's own workspace.
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&loss_sum_), sizeof(double)));
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&nonfinite_), sizeof(int)));
  memory_.set_stream(launch_.stream);
}

template <class S> CudaBackend<S>::~CudaBackend() {
  (void)cudaStreamSynchronize(launch_.stream);
  auto destroy = [](cudaEvent_t e) { (void)cudaEventDestroy(e); };
  for (auto e : free_events_) destroy(e);
  for (auto& part : parts_)
    for (auto& i : part) {
      destroy(i.begin);
      destroy(i.end);
    }
  for (auto& [producer, i] : waits_) {
    destroy(i.begin);
    destroy(i.end);
  }
  (void)cudaFree(loss_sum_);
  (void)cudaFree(nonfinite_);
  (void)cublasDestroy(launch_.blas);
  (void)cudaStreamDestroy(launch_.stream);
}

// ---- layer kernels: device_kernels.hpp and flash_attention.hpp on the compute stream

template <class S>
void CudaBackend<S>::embedding_forward(S* out, const std::int32_t* tokens, const S* wte,
                                       const S* wpe, std::int64_t batch, std::int64_t seq,
                                       std::int64_t channels) {
  cuda::embedding_forward(launch_, out, tokens, wte, wpe, batch, seq, channels);
}
template <class S>
void CudaBackend<S>::embedding_backward(S* dwte, S* dwpe, const S* dout, const std::int32_t* tokens,
                                        std::int64_t batch, std::int64_t seq,
                                        std::int64_t channels) {
  cuda::embedding_backward(launch_, dwte, dwpe, dout, tokens, batch, seq, channels);
}
template <class S>
void CudaBackend<S>::linear_forward(S* y, const S* x, const S* w, const S* b, std::int64_t n,
                                    std::int64_t in, std::int64_t out, bool accumulate) {
  cuda::linear_forward(launch_, y, x, w, b, n, in, out, accumulate);
}
template <class S>
void CudaBackend<S>::linear_backward(S* dx, S* dw, S* db, const S* dy, const S* x, const S* w,
                                     std::int64_t n, std::int64_t in, std::int64_t out) {
  cuda::linear_backward(launch_, dx, dw, db, dy, x, w, n, in, out);
}
template <class S>
void CudaBackend<S>::layernorm_forward(S* y, A* mean, A* rstd, const S* x, const S* w, const S* b,
                                       std::int64_t n, std::int64_t channels, A eps) {
  cuda::layernorm_forward(launch_, y, mean, rstd, x, w, b, n, channels, eps);
}
template <class S>
void CudaBackend<S>::layernorm_backward(S* dx, S* dw, S* db, const S* dy, const S* x, const S* w,
                                        const A* mean, const A* rstd, std::int64_t n,
                                        std::int64_t channels) {
  cuda::layernorm_backward(launch_, dx, dw, db, dy, x, w, mean, rstd, n, channels);
}
template <class S>
void CudaBackend<S>::rmsnorm_forward(S* y, A* rstd, const S* x, const S* w, std::int64_t n,
                                     std::int64_t channels, A eps) {
  cuda::rmsnorm_forward(launch_, y, rstd, x, w, n, channels, eps);
}
template <class S>
void CudaBackend<S>::rmsnorm_backward(S* dx, S* dw, const S* dy, const S* x, const S* w,
                                      const A* rstd, std::int64_t n, std::int64_t channels) {
  cuda::rmsnorm_backward(launch_, dx, dw, dy, x, w, rstd, n, channels);
}
template <class S>
void CudaBackend<S>::rope_forward(S* x, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                                  std::int64_t head_dim, double theta) {
  cuda::rope_forward(launch_, x, batch, seq, heads, head_dim, theta);
}
template <class S>
void CudaBackend<S>::rope_backward(S* dx, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                                   std::int64_t head_dim, double theta) {
  cuda::rope_backward(launch_, dx, batch, seq, heads, head_dim, theta);
}
template <class S>
void CudaBackend<S>::attention_forward(S* out, S* probs, const S* q, const S* k, const S* v,
                                       std::int64_t batch, std::int64_t seq, std::int64_t heads,
                                       std::int64_t kv_heads, std::int64_t head_dim) {
  cuda::attention_forward(launch_, out, probs, q, k, v, batch, seq, heads, kv_heads, head_dim);
}
template <class S>
std::int64_t CudaBackend<S>::attention_scratch_elements(std::int64_t batch, std::int64_t seq,
                                                        std::int64_t heads) const {
  return cuda::attention_scratch_elements(batch, seq, heads);
}
template <class S>
void CudaBackend<S>::attention_backward(S* dq, S* dk, S* dv, S* scratch, const S* dout,
                                        const S* probs, const S* q, const S* k, const S* v,
                                        std::int64_t batch, std::int64_t seq, std::int64_t heads,
                                        std::int64_t kv_heads, std::int64_t head_dim) {
  cuda::attention_backward(launch_, dq, dk, dv, scratch, dout, probs, q, k, v, batch, seq, heads,
                           kv_heads, head_dim);
}
template <class S> bool CudaBackend<S>::supports_flash_attention(std::int64_t head_dim) const {
  return flash_attention_supports<S>(head_dim);
}
template <class S>
void CudaBackend<S>::flash_attention_forward(S* out, A* lse, const S* q, const S* k, const S* v,
                                             std::int64_t batch, std::int64_t seq,
                                             std::int64_t heads, std::int64_t kv_heads,
                                             std::int64_t head_dim) {
  cuda::flash_attention_forward(launch_.stream, out, lse, q, k, v, batch, seq, heads, kv_heads,
                                head_dim);
}
template <class S>
void CudaBackend<S>::flash_attention_backward(S* dq, S* dk, S* dv, A* delta, const S* dout,
                                              const S* out, const A* lse, const S* q, const S* k,
                                              const S* v, std::int64_t batch, std::int64_t seq,
                                              std::int64_t heads, std::int64_t kv_heads,
                                              std::int64_t head_dim) {
  cuda::flash_attention_backward(launch_.stream, dq, dk, dv, delta, dout, out, lse, q, k, v, batch,
                                 seq, heads, kv_heads, head_dim);
}
template <class S> void CudaBackend<S>::gelu_forward(S* out, const S* in, std::int64_t n) {
  cuda::gelu_forward(launch_, out, in, n);
}
template <class S>
void CudaBackend<S>::gelu_backward(S* din, const S* in, const S* dout, std::int64_t n) {
  cuda::gelu_backward(launch_, din, in, dout, n);
}
template <class S>
void CudaBackend<S>::swiglu_forward(S* out, const S* gate, const S* up, std::int64_t n) {
  cuda::swiglu_forward(launch_, out, gate, up, n);
}
template <class S>
void CudaBackend<S>::swiglu_backward(S* dgate, S* dup, const S* dout, const S* gate, const S* up,
                                     std::int64_t n) {
  cuda::swiglu_backward(launch_, dgate, dup, dout, gate, up, n);
}
template <class S>
void CudaBackend<S>::log_softmax_forward(A* logp, const S* logits, std::int64_t n,
                                         std::int64_t vocab) {
  cuda::log_softmax_forward(launch_, logp, logits, n, vocab);
}
template <class S>
double CudaBackend<S>::nll_loss_forward(const A* logp, const std::int32_t* targets, std::int64_t n,
                                        std::int64_t vocab) {
  CUDA_OK(cudaMemsetAsync(loss_sum_, 0, sizeof(double), launch_.stream));
  cuda::nll_loss_forward(launch_, loss_sum_, logp, targets, n, vocab);
  double sum = 0;
  CUDA_OK(cudaMemcpyAsync(&sum, loss_sum_, sizeof(double), cudaMemcpyDeviceToHost, launch_.stream));
  CUDA_OK(cudaStreamSynchronize(launch_.stream));
  return sum;
}
template <class S>
void CudaBackend<S>::nll_loss_backward(A* dlogp, const std::int32_t* targets, std::int64_t n,
                                       std::int64_t vocab, A scale) {
  cuda::nll_loss_backward(launch_, dlogp, targets, n, vocab, scale);
}
template <class S>
void CudaBackend<S>::log_softmax_backward(S* dlogits, const A* dlogp, const A* logp, std::int64_t n,
                                          std::int64_t vocab) {
  cuda::log_softmax_backward(launch_, dlogits, dlogp, logp, n, vocab);
}
template <class S> void CudaBackend<S>::copy(S* dst, const S* src, std::int64_t n) {
  cuda::copy(launch_, dst, src, n);
}
template <class S> void CudaBackend<S>::add(S* dst, const S* src, std::int64_t n) {
  cuda::add(launch_, dst, src, n);
}
template <class S>
void CudaBackend<S>::adamw_step(A* params, const A* grads, A* exp_avg, A* exp_avg_sq,
                                std::int64_t n, std::int64_t step, const AdamWOptions& o) {
  cuda::adamw_step(launch_, params, grads, exp_avg, exp_avg_sq, n, step, o.lr, o.beta1, o.beta2,
                   o.eps, o.weight_decay);
}
template <class S> void CudaBackend<S>::narrow(S* dst, const A* src, std::int64_t n) {
  cuda::narrow(launch_, dst, src, n);  // a copy for float
}
template <class S> void CudaBackend<S>::widen_add(A* dst, const S* src, std::int64_t n) {
  cuda::widen_add(launch_, dst, src, n);  // an add for float
}
template <class S> void CudaBackend<S>::copy_wide(A* dst, const A* src, std::int64_t n) {
  cuda::copy(launch_, dst, src, n);
}
template <class S> void CudaBackend<S>::scale(A* x, std::int64_t n, double factor) {
  cuda::scale(launch_, x, static_cast<float>(factor), n);
}
template <class S> bool CudaBackend<S>::all_finite(const A* x, std::int64_t n) {
  CUDA_OK(cudaMemsetAsync(nonfinite_, 0, sizeof(int), launch_.stream));
  cuda::count_nonfinite(launch_, nonfinite_, x, n);
  int count = 0;
  CUDA_OK(cudaMemcpyAsync(&count, nonfinite_, sizeof(int), cudaMemcpyDeviceToHost, launch_.stream));
  CUDA_OK(cudaStreamSynchronize(launch_.stream));
  return count == 0;
}

// ---- order and time

template <class S> cudaStream_t CudaBackend<S>::stream_of(const comm::Communicator* c) const {
  if (c == nullptr) return launch_.stream;
  auto* s = static_cast<cudaStream_t>(c->stream_handle());
  // A group without a stream (a rehearsal's stand-in copies) works on the current memory stream,
  // which is the compute stream: it is ordered with the compute already.
  return s != nullptr ? s : launch_.stream;
}

template <class S> cudaEvent_t CudaBackend<S>::event() {
  if (!free_events_.empty()) {
    auto e = free_events_.back();
    free_events_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  CUDA_OK(cudaEventCreate(&e));
  return e;
}

template <class S>
void CudaBackend<S>::wait(comm::Communicator* waiter, comm::Communicator* producer) {
  const cudaStream_t w = stream_of(waiter), p = stream_of(producer);
  if (w == p) return;
  cudaEvent_t ready = event();
  CUDA_OK(cudaEventRecord(ready, p));
  if (w == launch_.stream) {  // the compute stalls from `begin` until the collectives are done
    Interval i{event(), event()};
    CUDA_OK(cudaEventRecord(i.begin, w));
    CUDA_OK(cudaStreamWaitEvent(w, ready, 0));
    CUDA_OK(cudaEventRecord(i.end, w));
    waits_.emplace_back(producer, i);
  } else {
    CUDA_OK(cudaStreamWaitEvent(w, ready, 0));
  }
  // A wait holds the event's state at the call: the event may be recorded again after it.
  free_events_.push_back(ready);
}

template <class S> void CudaBackend<S>::record_use(const void* p, comm::Communicator* user) {
  memory_.record_use(const_cast<void*>(p), stream_of(user));
}

template <class S> void CudaBackend<S>::allocate_on(comm::Communicator* stream) {
  memory_.set_stream(stream_of(stream));
}

template <class S> void CudaBackend<S>::synchronize() {
  CUDA_OK(cudaStreamSynchronize(launch_.stream));
}

template <class S> void CudaBackend<S>::begin(Part part) {
  Interval i{event(), nullptr};
  CUDA_OK(cudaEventRecord(i.begin, launch_.stream));
  parts_[static_cast<std::size_t>(part)].push_back(i);
}

template <class S> void CudaBackend<S>::end(Part part) {
  auto& open = parts_[static_cast<std::size_t>(part)];
  if (open.empty() || open.back().end != nullptr)
    throw std::logic_error("CudaBackend::end without begin");
  open.back().end = event();
  CUDA_OK(cudaEventRecord(open.back().end, launch_.stream));
}

template <class S> typename Backend<S>::PartSeconds CudaBackend<S>::take_seconds() {
  synchronize();
  // The interval's seconds; its events go back to the pool.
  auto seconds = [this](const Interval& i) {
    double s = 0;
    if (i.end != nullptr) {
      float ms = 0;
      CUDA_OK(cudaEventElapsedTime(&ms, i.begin, i.end));
      s = 1e-3 * static_cast<double>(ms);
      free_events_.push_back(i.end);
    }
    free_events_.push_back(i.begin);
    return s;
  };
  auto total = [&](std::vector<Interval>& intervals) {
    double sum = 0;
    for (const auto& i : intervals) sum += seconds(i);
    intervals.clear();
    return sum;
  };
  PartSeconds s;
  s.forward = total(parts_[static_cast<std::size_t>(Part::forward)]);
  s.backward = total(parts_[static_cast<std::size_t>(Part::backward)]);
  s.optimizer = total(parts_[static_cast<std::size_t>(Part::optimizer)]);
  s.copy = total(parts_[static_cast<std::size_t>(Part::copy)]);
  for (const auto& [producer, i] : waits_) s.comm_waits[producer] += seconds(i);
  waits_.clear();
  return s;
}

template class CudaBackend<float>;
template class CudaBackend<bf16>;
template class CudaBackend<f16>;

}  // namespace shardplan::kernels::cuda
