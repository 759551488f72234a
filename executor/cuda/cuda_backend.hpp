// The CUDA backend of the model and the engine (executor/backend.hpp): every kernel queued on one
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
// fp32 throughout: activations, parameters, gradients and optimizer states are float, the GEMMs
// use TF32 tensor cores when `tf32` is set (PyTorch's allow_tf32), full fp32 otherwise.
#pragma once

#include <array>
#include <memory>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "executor/backend.hpp"
#include "executor/cuda/device_kernels.hpp"
#include "executor/cuda/device_memory.hpp"

namespace shardplan::executor::cuda {

class CudaBackend final : public Backend<float> {
 public:
  // On the current device (cudaSetDevice first); allocations of `memory` are queued on this
  // backend's compute stream. Throws std::runtime_error when CUDA or cuBLAS fail.
  CudaBackend(DeviceMemory& memory, bool tf32);
  ~CudaBackend() override;

  cudaStream_t compute_stream() const { return launch_.stream; }

  const char* name() const override { return "cuda"; }
  void embedding_forward(float* out, const std::int32_t* tokens, const float* wte,
                         const float* wpe, std::int64_t batch, std::int64_t seq,
                         std::int64_t channels) override;
  void embedding_backward(float* dwte, float* dwpe, const float* dout,
                          const std::int32_t* tokens, std::int64_t batch, std::int64_t seq,
                          std::int64_t channels) override;
  void linear_forward(float* y, const float* x, const float* w, const float* b, std::int64_t n,
                      std::int64_t in, std::int64_t out, bool accumulate) override;
  void linear_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                       const float* w, std::int64_t n, std::int64_t in,
                       std::int64_t out) override;
  void layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* w,
                         const float* b, std::int64_t n, std::int64_t channels,
                         float eps) override;
  void layernorm_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                          const float* w, const float* mean, const float* rstd, std::int64_t n,
                          std::int64_t channels) override;
  void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, std::int64_t n,
                       std::int64_t channels, float eps) override;
  void rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                        const float* rstd, std::int64_t n, std::int64_t channels) override;
  void rope_forward(float* x, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                    std::int64_t head_dim, double theta) override;
  void rope_backward(float* dx, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                     std::int64_t head_dim, double theta) override;
  void attention_forward(float* out, float* probs, const float* q, const float* k,
                         const float* v, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                         std::int64_t kv_heads, std::int64_t head_dim) override;
  std::int64_t attention_scratch_elements(std::int64_t batch, std::int64_t seq,
                                          std::int64_t heads) const override;
  void attention_backward(float* dq, float* dk, float* dv, float* scratch, const float* dout,
                          const float* probs, const float* q, const float* k, const float* v,
                          std::int64_t batch, std::int64_t seq, std::int64_t heads,
                          std::int64_t kv_heads, std::int64_t head_dim) override;
  bool supports_flash_attention(std::int64_t head_dim) const override;
  void flash_attention_forward(float* out, float* lse, const float* q, const float* k,
                               const float* v, std::int64_t batch, std::int64_t seq,
                               std::int64_t heads, std::int64_t kv_heads,
                               std::int64_t head_dim) override;
  void flash_attention_backward(float* dq, float* dk, float* dv, float* delta, const float* dout,
                                const float* out, const float* lse, const float* q,
                                const float* k, const float* v, std::int64_t batch,
                                std::int64_t seq, std::int64_t heads, std::int64_t kv_heads,
                                std::int64_t head_dim) override;
  void gelu_forward(float* out, const float* in, std::int64_t n) override;
  void gelu_backward(float* din, const float* in, const float* dout, std::int64_t n) override;
  void swiglu_forward(float* out, const float* gate, const float* up, std::int64_t n) override;
  void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                       const float* up, std::int64_t n) override;
  void log_softmax_forward(float* logp, const float* logits, std::int64_t n,
                           std::int64_t vocab) override;
  double nll_loss_forward(const float* logp, const std::int32_t* targets, std::int64_t n,
                          std::int64_t vocab) override;
  void nll_loss_backward(float* dlogp, const std::int32_t* targets, std::int64_t n,
                         std::int64_t vocab, float scale) override;
  void log_softmax_backward(float* dlogits, const float* dlogp, const float* logp, std::int64_t n,
                            std::int64_t vocab) override;
  void copy(float* dst, const float* src, std::int64_t n) override;
  void add(float* dst, const float* src, std::int64_t n) override;
  void adamw_step(float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
                  std::int64_t n, std::int64_t step, const AdamWOptions& options) override;
  void narrow(float* dst, const float* src, std::int64_t n) override;
  void widen_add(float* dst, const float* src, std::int64_t n) override;
  void scale(float* x, std::int64_t n, double factor) override;
  bool all_finite(const float* x, std::int64_t n) override;

  void wait(comm::Communicator* waiter, comm::Communicator* producer) override;
  void record_use(const void* p, comm::Communicator* user) override;
  void allocate_on(comm::Communicator* stream) override;
  void synchronize() override;
  void begin(Part part) override;
  void end(Part part) override;
  PartSeconds take_seconds() override;

 private:
  cudaStream_t stream_of(const comm::Communicator* c) const;
  cudaEvent_t event(); // a recycled timing-capable event
  // Opened and closed events on the compute stream, summed at take_seconds().
  struct Interval {
    cudaEvent_t begin = nullptr, end = nullptr;
  };

  DeviceMemory& memory_;
  Launch launch_;
  double* loss_sum_ = nullptr; // one double on the device
  int* nonfinite_ = nullptr;    // all_finite's count, on the device
  std::vector<cudaEvent_t> free_events_;
  std::array<std::vector<Interval>, kParts> parts_; // by Part
  // The compute stream's waits for collectives, by the group whose stream it waited for.
  std::vector<std::pair<const comm::Communicator*, Interval>> waits_;
};

} // namespace shardplan::executor::cuda
