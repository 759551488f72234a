// The CUDA backend of the model and the engine (kernels/backend.hpp): every kernel queued on one
// compute stream of the rank's GPU (device_kernels.hpp, flash_attention.hpp, cuBLAS for the
// GEMMs), on memory from the GPU's caching pool (device_memory.hpp). Collectives run on their
// groups' own NCCL streams; the engine orders them against the compute with wait(), which records
// a CUDA event on one stream and makes the other wait for it, never the host.
//
// Timing is CUDA events on the compute stream: a part's seconds are the events' elapsed time, and
// a wait of the compute stream for a collective stream is bracketed by two events, so the time the
// compute stalled on communication is measured where it happens (PartSeconds::comm_waits).
//
// The loss of a micro-batch is the one value read back to the host during a step: the head's
// forward waits for the compute stream (once per micro-batch; the backward is queued right after).
//
// Storage S: float, bf16 or f16 (kernels/scalar.hpp), the three instantiated in cuda_backend.cpp.
// Activations, the compute copies of the parameters and the gradients the kernels produce are in
// S; the norm statistics, the log-sum-exp, the loss's log-probabilities, the master weights, their
// gradients and the optimizer states in A = float (narrow and widen_add convert between the two).
// The kernels compute in fp32 whatever S (device_kernels.hpp). fp32 GEMMs use TF32 tensor cores
// when `tf32` is set (PyTorch's allow_tf32), full fp32 otherwise; bf16 and f16 GEMMs use the tensor
// cores with fp32 accumulation whatever `tf32` says.
#pragma once

#include <array>
#include <memory>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "kernels/backend.hpp"
#include "kernels/cuda/device_kernels.hpp"
#include "kernels/cuda/device_memory.hpp"

namespace shardplan::kernels::cuda {

template <class S> class CudaBackend final : public Backend<S> {
public:
  using A = accum_t<S>;  // float
  using Part = typename Backend<S>::Part;
  using PartSeconds = typename Backend<S>::PartSeconds;

  // On the current device (cudaSetDevice first); allocations of `memory` are queued on this
  // backend's compute stream. Throws std::runtime_error when CUDA or cuBLAS fail.
  CudaBackend(DeviceMemory& memory, bool tf32);
  ~CudaBackend() override;

  cudaStream_t compute_stream() const { return launch_.stream; }

  const char* name() const override { return "cuda"; }
  void embedding_forward(S* out, const std::int32_t* tokens, const S* wte, const S* wpe,
                         std::int64_t batch, std::int64_t seq, std::int64_t channels) override;
  void embedding_backward(S* dwte, S* dwpe, const S* dout, const std::int32_t* tokens,
                          std::int64_t batch, std::int64_t seq, std::int64_t channels) override;
  void linear_forward(S* y, const S* x, const S* w, const S* b, std::int64_t n, std::int64_t in,
                      std::int64_t out, bool accumulate) override;
  void linear_backward(S* dx, S* dw, S* db, const S* dy, const S* x, const S* w, std::int64_t n,
                       std::int64_t in, std::int64_t out) override;
  void layernorm_forward(S* y, A* mean, A* rstd, const S* x, const S* w, const S* b, std::int64_t n,
                         std::int64_t channels, A eps) override;
  void layernorm_backward(S* dx, S* dw, S* db, const S* dy, const S* x, const S* w, const A* mean,
                          const A* rstd, std::int64_t n, std::int64_t channels) override;
  void rmsnorm_forward(S* y, A* rstd, const S* x, const S* w, std::int64_t n, std::int64_t channels,
                       A eps) override;
  void rmsnorm_backward(S* dx, S* dw, const S* dy, const S* x, const S* w, const A* rstd,
                        std::int64_t n, std::int64_t channels) override;
  void rope_forward(S* x, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                    std::int64_t head_dim, double theta) override;
  void rope_backward(S* dx, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                     std::int64_t head_dim, double theta) override;
  void attention_forward(S* out, S* probs, const S* q, const S* k, const S* v, std::int64_t batch,
                         std::int64_t seq, std::int64_t heads, std::int64_t kv_heads,
                         std::int64_t head_dim) override;
  std::int64_t attention_scratch_elements(std::int64_t batch, std::int64_t seq,
                                          std::int64_t heads) const override;
  void attention_backward(S* dq, S* dk, S* dv, S* scratch, const S* dout, const S* probs,
                          const S* q, const S* k, const S* v, std::int64_t batch, std::int64_t seq,
                          std::int64_t heads, std::int64_t kv_heads,
                          std::int64_t head_dim) override;
  bool supports_flash_attention(std::int64_t head_dim) const override;
  void flash_attention_forward(S* out, A* lse, const S* q, const S* k, const S* v,
                               std::int64_t batch, std::int64_t seq, std::int64_t heads,
                               std::int64_t kv_heads, std::int64_t head_dim) override;
  void flash_attention_backward(S* dq, S* dk, S* dv, A* delta, const S* dout, const S* out,
                                const A* lse, const S* q, const S* k, const S* v,
                                std::int64_t batch, std::int64_t seq, std::int64_t heads,
                                std::int64_t kv_heads, std::int64_t head_dim) override;
  void gelu_forward(S* out, const S* in, std::int64_t n) override;
  void gelu_backward(S* din, const S* in, const S* dout, std::int64_t n) override;
  void swiglu_forward(S* out, const S* gate, const S* up, std::int64_t n) override;
  void swiglu_backward(S* dgate, S* dup, const S* dout, const S* gate, const S* up,
                       std::int64_t n) override;
  void log_softmax_forward(A* logp, const S* logits, std::int64_t n, std::int64_t vocab) override;
  double nll_loss_forward(const A* logp, const std::int32_t* targets, std::int64_t n,
                          std::int64_t vocab) override;
  void nll_loss_backward(A* dlogp, const std::int32_t* targets, std::int64_t n, std::int64_t vocab,
                         A scale) override;
  void log_softmax_backward(S* dlogits, const A* dlogp, const A* logp, std::int64_t n,
                            std::int64_t vocab) override;
  void copy(S* dst, const S* src, std::int64_t n) override;
  void add(S* dst, const S* src, std::int64_t n) override;
  void adamw_step(A* params, const A* grads, A* exp_avg, A* exp_avg_sq, std::int64_t n,
                  std::int64_t step, const AdamWOptions& options) override;
  void narrow(S* dst, const A* src, std::int64_t n) override;
  void widen_add(A* dst, const S* src, std::int64_t n) override;
  void copy_wide(A* dst, const A* src, std::int64_t n) override;
  void scale(A* x, std::int64_t n, double factor) override;
  bool all_finite(const A* x, std::int64_t n) override;

  void wait(comm::Communicator* waiter, comm::Communicator* producer) override;
  void record_use(const void* p, comm::Communicator* user) override;
  void allocate_on(comm::Communicator* stream) override;
  void synchronize() override;
  void begin(Part part) override;
  void end(Part part) override;
  PartSeconds take_seconds() override;

private:
  cudaStream_t stream_of(const comm::Communicator* c) const;
  cudaEvent_t event();  // a recycled timing-capable event
  // Opened and closed events on the compute stream, summed at take_seconds().
  struct Interval {
    cudaEvent_t begin = nullptr, end = nullptr;
  };

  DeviceMemory& memory_;
  Launch launch_;
  double* loss_sum_ = nullptr;  // one double on the device
  int* nonfinite_ = nullptr;    // all_finite's count, on the device
  std::vector<cudaEvent_t> free_events_;
  std::array<std::vector<Interval>, Backend<S>::kParts> parts_;  // by Part
  // The compute stream's waits for collectives, by the group whose stream it waited for.
  std::vector<std::pair<const comm::Communicator*, Interval>> waits_;
};

extern template class CudaBackend<float>;
extern template class CudaBackend<bf16>;
extern template class CudaBackend<f16>;

}  // namespace shardplan::kernels::cuda
