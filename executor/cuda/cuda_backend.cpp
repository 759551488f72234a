#include "executor/cuda/cuda_backend.hpp"

#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "executor/cuda/flash_attention.hpp"

namespace shardplan::executor::cuda {
namespace {

void check(cudaError_t code, const char* call) {
  if (code != cudaSuccess)
    throw std::runtime_error(
        fmt::format("{} failed: {}: {}", call, cudaGetErrorName(code), cudaGetErrorString(code)));
}

void check(cublasStatus_t code, const char* call) {
  if (code != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(fmt::format("{} failed: cuBLAS status {}", call,
                                         static_cast<int>(code)));
}

#define CUDA_OK(call) check(call, #call)

} // namespace

CudaBackend::CudaBackend(DeviceMemory& memory, bool tf32) : memory_(memory) {
  CUDA_OK(cudaStreamCreateWithFlags(&launch_.stream, cudaStreamNonBlocking));
  CUDA_OK(cublasCreate(&launch_.blas));
  CUDA_OK(cublasSetStream(launch_.blas, launch_.stream));
  set_tf32(launch_.blas, tf32);
  // The loss accumulator: 8 bytes outside the tracked allocator, like cuBLAS's own workspace.
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&loss_sum_), sizeof(double)));
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&nonfinite_), sizeof(int)));
  memory_.set_stream(launch_.stream);
}

CudaBackend::~CudaBackend() {
  (void)cudaStreamSynchronize(launch_.stream);
  auto destroy = [](cudaEvent_t e) { (void)cudaEventDestroy(e); };
  for (auto e : free_events_)
    destroy(e);
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

void CudaBackend::embedding_forward(float* out, const std::int32_t* tokens, const float* wte,
                                    const float* wpe, std::int64_t batch, std::int64_t seq,
                                    std::int64_t channels) {
  cuda::embedding_forward(launch_, out, tokens, wte, wpe, batch, seq, channels);
}
void CudaBackend::embedding_backward(float* dwte, float* dwpe, const float* dout,
                                     const std::int32_t* tokens, std::int64_t batch,
                                     std::int64_t seq, std::int64_t channels) {
  cuda::embedding_backward(launch_, dwte, dwpe, dout, tokens, batch, seq, channels);
}
void CudaBackend::linear_forward(float* y, const float* x, const float* w, const float* b,
                                 std::int64_t n, std::int64_t in, std::int64_t out,
                                 bool accumulate) {
  cuda::linear_forward(launch_, y, x, w, b, n, in, out, accumulate);
}
void CudaBackend::linear_backward(float* dx, float* dw, float* db, const float* dy,
                                  const float* x, const float* w, std::int64_t n, std::int64_t in,
                                  std::int64_t out) {
  cuda::linear_backward(launch_, dx, dw, db, dy, x, w, n, in, out);
}
void CudaBackend::layernorm_forward(float* y, float* mean, float* rstd, const float* x,
                                    const float* w, const float* b, std::int64_t n,
                                    std::int64_t channels, float eps) {
  cuda::layernorm_forward(launch_, y, mean, rstd, x, w, b, n, channels, eps);
}
void CudaBackend::layernorm_backward(float* dx, float* dw, float* db, const float* dy,
                                     const float* x, const float* w, const float* mean,
                                     const float* rstd, std::int64_t n, std::int64_t channels) {
  cuda::layernorm_backward(launch_, dx, dw, db, dy, x, w, mean, rstd, n, channels);
}
void CudaBackend::rmsnorm_forward(float* y, float* rstd, const float* x, const float* w,
                                  std::int64_t n, std::int64_t channels, float eps) {
  cuda::rmsnorm_forward(launch_, y, rstd, x, w, n, channels, eps);
}
void CudaBackend::rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x,
                                   const float* w, const float* rstd, std::int64_t n,
                                   std::int64_t channels) {
  cuda::rmsnorm_backward(launch_, dx, dw, dy, x, w, rstd, n, channels);
}
void CudaBackend::rope_forward(float* x, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                               std::int64_t head_dim, double theta) {
  cuda::rope_forward(launch_, x, batch, seq, heads, head_dim, theta);
}
void CudaBackend::rope_backward(float* dx, std::int64_t batch, std::int64_t seq,
                                std::int64_t heads, std::int64_t head_dim, double theta) {
  cuda::rope_backward(launch_, dx, batch, seq, heads, head_dim, theta);
}
void CudaBackend::attention_forward(float* out, float* probs, const float* q, const float* k,
                                    const float* v, std::int64_t batch, std::int64_t seq,
                                    std::int64_t heads, std::int64_t kv_heads,
                                    std::int64_t head_dim) {
  cuda::attention_forward(launch_, out, probs, q, k, v, batch, seq, heads, kv_heads, head_dim);
}
std::int64_t CudaBackend::attention_scratch_elements(std::int64_t batch, std::int64_t seq,
                                                     std::int64_t heads) const {
  return cuda::attention_scratch_elements(batch, seq, heads);
}
void CudaBackend::attention_backward(float* dq, float* dk, float* dv, float* scratch,
                                     const float* dout, const float* probs, const float* q,
                                     const float* k, const float* v, std::int64_t batch,
                                     std::int64_t seq, std::int64_t heads, std::int64_t kv_heads,
                                     std::int64_t head_dim) {
  cuda::attention_backward(launch_, dq, dk, dv, scratch, dout, probs, q, k, v, batch, seq, heads,
                           kv_heads, head_dim);
}
bool CudaBackend::supports_flash_attention(std::int64_t head_dim) const {
  return flash_attention_supports(head_dim);
}
void CudaBackend::flash_attention_forward(float* out, float* lse, const float* q, const float* k,
                                          const float* v, std::int64_t batch, std::int64_t seq,
                                          std::int64_t heads, std::int64_t kv_heads,
                                          std::int64_t head_dim) {
  cuda::flash_attention_forward(launch_.stream, out, lse, q, k, v, batch, seq, heads, kv_heads,
                                head_dim);
}
void CudaBackend::flash_attention_backward(float* dq, float* dk, float* dv, float* delta,
                                           const float* dout, const float* out, const float* lse,
                                           const float* q, const float* k, const float* v,
                                           std::int64_t batch, std::int64_t seq,
                                           std::int64_t heads, std::int64_t kv_heads,
                                           std::int64_t head_dim) {
  cuda::flash_attention_backward(launch_.stream, dq, dk, dv, delta, dout, out, lse, q, k, v,
                                 batch, seq, heads, kv_heads, head_dim);
}
void CudaBackend::gelu_forward(float* out, const float* in, std::int64_t n) {
  cuda::gelu_forward(launch_, out, in, n);
}
void CudaBackend::gelu_backward(float* din, const float* in, const float* dout, std::int64_t n) {
  cuda::gelu_backward(launch_, din, in, dout, n);
}
void CudaBackend::swiglu_forward(float* out, const float* gate, const float* up, std::int64_t n) {
  cuda::swiglu_forward(launch_, out, gate, up, n);
}
void CudaBackend::swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                                  const float* up, std::int64_t n) {
  cuda::swiglu_backward(launch_, dgate, dup, dout, gate, up, n);
}
void CudaBackend::log_softmax_forward(float* logp, const float* logits, std::int64_t n,
                                      std::int64_t vocab) {
  cuda::log_softmax_forward(launch_, logp, logits, n, vocab);
}
double CudaBackend::nll_loss_forward(const float* logp, const std::int32_t* targets,
                                     std::int64_t n, std::int64_t vocab) {
  CUDA_OK(cudaMemsetAsync(loss_sum_, 0, sizeof(double), launch_.stream));
  cuda::nll_loss_forward(launch_, loss_sum_, logp, targets, n, vocab);
  double sum = 0;
  CUDA_OK(cudaMemcpyAsync(&sum, loss_sum_, sizeof(double), cudaMemcpyDeviceToHost,
                          launch_.stream));
  CUDA_OK(cudaStreamSynchronize(launch_.stream));
  return sum;
}
void CudaBackend::nll_loss_backward(float* dlogp, const std::int32_t* targets, std::int64_t n,
                                    std::int64_t vocab, float scale) {
  cuda::nll_loss_backward(launch_, dlogp, targets, n, vocab, scale);
}
void CudaBackend::log_softmax_backward(float* dlogits, const float* dlogp, const float* logp,
                                       std::int64_t n, std::int64_t vocab) {
  cuda::log_softmax_backward(launch_, dlogits, dlogp, logp, n, vocab);
}
void CudaBackend::copy(float* dst, const float* src, std::int64_t n) {
  cuda::copy(launch_, dst, src, n);
}
void CudaBackend::add(float* dst, const float* src, std::int64_t n) {
  cuda::add(launch_, dst, src, n);
}
void CudaBackend::adamw_step(float* params, const float* grads, float* exp_avg,
                             float* exp_avg_sq, std::int64_t n, std::int64_t step,
                             const AdamWOptions& o) {
  cuda::adamw_step(launch_, params, grads, exp_avg, exp_avg_sq, n, step, o.lr, o.beta1, o.beta2,
                   o.eps, o.weight_decay);
}
void CudaBackend::narrow(float* dst, const float* src, std::int64_t n) {
  cuda::copy(launch_, dst, src, n);
}
void CudaBackend::widen_add(float* dst, const float* src, std::int64_t n) {
  cuda::add(launch_, dst, src, n);
}
void CudaBackend::scale(float* x, std::int64_t n, double factor) {
  cuda::scale(launch_, x, static_cast<float>(factor), n);
}
bool CudaBackend::all_finite(const float* x, std::int64_t n) {
  CUDA_OK(cudaMemsetAsync(nonfinite_, 0, sizeof(int), launch_.stream));
  cuda::count_nonfinite(launch_, nonfinite_, x, n);
  int count = 0;
  CUDA_OK(cudaMemcpyAsync(&count, nonfinite_, sizeof(int), cudaMemcpyDeviceToHost,
                          launch_.stream));
  CUDA_OK(cudaStreamSynchronize(launch_.stream));
  return count == 0;
}

// ---- order and time

cudaStream_t CudaBackend::stream_of(const comm::Communicator* c) const {
  if (c == nullptr)
    return launch_.stream;
  auto* s = static_cast<cudaStream_t>(c->cuda_stream());
  // A group without a stream (a rehearsal's stand-in copies) works on the current memory stream,
  // which is the compute stream: it is ordered with the compute already.
  return s != nullptr ? s : launch_.stream;
}

cudaEvent_t CudaBackend::event() {
  if (!free_events_.empty()) {
    auto e = free_events_.back();
    free_events_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  CUDA_OK(cudaEventCreate(&e));
  return e;
}

void CudaBackend::wait(comm::Communicator* waiter, comm::Communicator* producer) {
  const cudaStream_t w = stream_of(waiter), p = stream_of(producer);
  if (w == p)
    return;
  cudaEvent_t ready = event();
  CUDA_OK(cudaEventRecord(ready, p));
  if (w == launch_.stream) { // the compute stalls from `begin` until the collectives are done
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

void CudaBackend::record_use(const void* p, comm::Communicator* user) {
  memory_.record_use(const_cast<void*>(p), stream_of(user));
}

void CudaBackend::allocate_on(comm::Communicator* stream) {
  memory_.set_stream(stream_of(stream));
}

void CudaBackend::synchronize() {
  CUDA_OK(cudaStreamSynchronize(launch_.stream));
}

void CudaBackend::begin(Part part) {
  Interval i{event(), nullptr};
  CUDA_OK(cudaEventRecord(i.begin, launch_.stream));
  parts_[static_cast<std::size_t>(part)].push_back(i);
}

void CudaBackend::end(Part part) {
  auto& open = parts_[static_cast<std::size_t>(part)];
  if (open.empty() || open.back().end != nullptr)
    throw std::logic_error("CudaBackend::end without begin");
  open.back().end = event();
  CUDA_OK(cudaEventRecord(open.back().end, launch_.stream));
}

Backend<float>::PartSeconds CudaBackend::take_seconds() {
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
    for (const auto& i : intervals)
      sum += seconds(i);
    intervals.clear();
    return sum;
  };
  PartSeconds s;
  s.forward = total(parts_[static_cast<std::size_t>(Part::forward)]);
  s.backward = total(parts_[static_cast<std::size_t>(Part::backward)]);
  s.optimizer = total(parts_[static_cast<std::size_t>(Part::optimizer)]);
  s.copy = total(parts_[static_cast<std::size_t>(Part::copy)]);
  for (const auto& [producer, i] : waits_)
    s.comm_waits[producer] += seconds(i);
  waits_.clear();
  return s;
}

} // namespace shardplan::executor::cuda
