// Where the model and the engine compute: the layer kernels of kernels.hpp, the engine's copies,
// AdamW, and the order of compute against the collectives. The
// model and the sharding engine are written once against this interface (a device is a
// configuration, as a strategy is):
//
//   HostBackend<S>   runs every call on the calling thread over host memory (kernels.hpp); its
//                    collectives (MPI) complete when they return, so ordering is free.
//   CudaBackend      queues every call on the GPU's compute stream over device memory, cuBLAS for
//                    the GEMMs (kernels/cuda/cuda_backend.hpp); a collective runs on its group's
//                    own NCCL stream and the engine orders the two with the calls at the end.
//
// Pointers are in the memory of the allocator the backend was made with (TrackedAllocator::
// host_accessible() says whether the host may touch them). Every layer kernel keeps kernels.hpp's
// contract: backward kernels ADD into their outputs.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <span>
#include <stdexcept>
#include <string>

#include "comm/communicator.hpp"
#include "kernels/adamw.hpp"
#include "kernels/flash_attention_host.hpp"
#include "kernels/memory_source.hpp"
#include "kernels/scalar.hpp"

namespace shardplan::kernels {

template <class S> class Backend {
public:
  using A = accum_t<S>;  // norm statistics, log-sum-exp, the loss's log-probabilities (scalar.hpp)

  Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;
  virtual ~Backend() = default;

  virtual const char* name() const = 0;  // "cpu", "cuda"

  // ---- layer kernels: kernels.hpp, same arguments
  virtual void embedding_forward(S* out, const std::int32_t* tokens, const S* wte, const S* wpe,
                                 std::int64_t batch, std::int64_t seq, std::int64_t channels) = 0;
  virtual void embedding_backward(S* dwte, S* dwpe, const S* dout, const std::int32_t* tokens,
                                  std::int64_t batch, std::int64_t seq, std::int64_t channels) = 0;
  virtual void linear_forward(S* y, const S* x, const S* w, const S* b, std::int64_t n,
                              std::int64_t in, std::int64_t out, bool accumulate) = 0;
  virtual void linear_backward(S* dx, S* dw, S* db, const S* dy, const S* x, const S* w,
                               std::int64_t n, std::int64_t in, std::int64_t out) = 0;
  virtual void layernorm_forward(S* y, A* mean, A* rstd, const S* x, const S* w, const S* b,
                                 std::int64_t n, std::int64_t channels, A eps) = 0;
  virtual void layernorm_backward(S* dx, S* dw, S* db, const S* dy, const S* x, const S* w,
                                  const A* mean, const A* rstd, std::int64_t n,
                                  std::int64_t channels) = 0;
  virtual void rmsnorm_forward(S* y, A* rstd, const S* x, const S* w, std::int64_t n,
                               std::int64_t channels, A eps) = 0;
  virtual void rmsnorm_backward(S* dx, S* dw, const S* dy, const S* x, const S* w, const A* rstd,
                                std::int64_t n, std::int64_t channels) = 0;
  virtual void rope_forward(S* x, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                            std::int64_t head_dim, double theta) = 0;
  virtual void rope_backward(S* dx, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                             std::int64_t head_dim, double theta) = 0;
  // Materialized attention: probs [B, heads, T, T]. The backward's scratch holds
  // attention_scratch_elements(...) elements (one [T, T] on the host, whose loop runs one head at
  // a time; every head's on a GPU, whose GEMMs run them together).
  virtual void attention_forward(S* out, S* probs, const S* q, const S* k, const S* v,
                                 std::int64_t batch, std::int64_t seq, std::int64_t heads,
                                 std::int64_t kv_heads, std::int64_t head_dim) = 0;
  virtual std::int64_t attention_scratch_elements(std::int64_t batch, std::int64_t seq,
                                                  std::int64_t heads) const = 0;
  virtual void attention_backward(S* dq, S* dk, S* dv, S* scratch, const S* dout, const S* probs,
                                  const S* q, const S* k, const S* v, std::int64_t batch,
                                  std::int64_t seq, std::int64_t heads, std::int64_t kv_heads,
                                  std::int64_t head_dim) = 0;
  // Fused attention without the [T, T] scores (Dao 2023, FlashAttention-2): the forward keeps
  // lse [B, heads, T], the log-sum-exp of each score row; the backward recomputes the
  // probabilities from it and needs delta [B, heads, T] as scratch. Backends without it say so
  // (supports_flash_attention) and throw.
  virtual bool supports_flash_attention(std::int64_t head_dim) const = 0;
  virtual void flash_attention_forward(S* out, A* lse, const S* q, const S* k, const S* v,
                                       std::int64_t batch, std::int64_t seq, std::int64_t heads,
                                       std::int64_t kv_heads, std::int64_t head_dim) = 0;
  virtual void flash_attention_backward(S* dq, S* dk, S* dv, A* delta, const S* dout, const S* out,
                                        const A* lse, const S* q, const S* k, const S* v,
                                        std::int64_t batch, std::int64_t seq, std::int64_t heads,
                                        std::int64_t kv_heads, std::int64_t head_dim) = 0;
  virtual void gelu_forward(S* out, const S* in, std::int64_t n) = 0;
  virtual void gelu_backward(S* din, const S* in, const S* dout, std::int64_t n) = 0;
  virtual void swiglu_forward(S* out, const S* gate, const S* up, std::int64_t n) = 0;
  virtual void swiglu_backward(S* dgate, S* dup, const S* dout, const S* gate, const S* up,
                               std::int64_t n) = 0;
  virtual void log_softmax_forward(A* logp, const S* logits, std::int64_t n,
                                   std::int64_t vocab) = 0;
  // Σₙ −logp[n, target[n]]. A GPU backend waits here for its queued work (once per micro-batch).
  virtual double nll_loss_forward(const A* logp, const std::int32_t* targets, std::int64_t n,
                                  std::int64_t vocab) = 0;
  virtual void nll_loss_backward(A* dlogp, const std::int32_t* targets, std::int64_t n,
                                 std::int64_t vocab, A scale) = 0;
  virtual void log_softmax_backward(S* dlogits, const A* dlogp, const A* logp, std::int64_t n,
                                    std::int64_t vocab) = 0;

  // ---- vocabulary parallelism (kernels.hpp's vocab_* kernels, same arguments). Tensor
  // parallelism runs on the host backend only; another backend refuses them.
  virtual void vocab_embedding_forward(S* /*out*/, const std::int32_t* /*tokens*/, const S* /*wte*/,
                                       const S* /*wpe*/, std::int64_t /*begin*/,
                                       std::int64_t /*rows*/, std::int64_t /*batch*/,
                                       std::int64_t /*seq*/, std::int64_t /*channels*/) {
    refuse_vocab_parallel();
  }
  virtual void vocab_embedding_backward(S* /*dwte*/, S* /*dwpe*/, const S* /*dout*/,
                                        const std::int32_t* /*tokens*/, std::int64_t /*begin*/,
                                        std::int64_t /*rows*/, std::int64_t /*batch*/,
                                        std::int64_t /*seq*/, std::int64_t /*channels*/) {
    refuse_vocab_parallel();
  }
  virtual void logits_row_max(A* /*max*/, const S* /*logits*/, std::int64_t /*n*/,
                              std::int64_t /*vocab*/) {
    refuse_vocab_parallel();
  }
  virtual void logits_row_sum_exp(A* /*sum*/, const S* /*logits*/, const A* /*max*/,
                                  std::int64_t /*n*/, std::int64_t /*vocab*/) {
    refuse_vocab_parallel();
  }
  virtual void log_softmax_from_stats(A* /*logp*/, const S* /*logits*/, const A* /*max*/,
                                      const A* /*sum*/, std::int64_t /*n*/,
                                      std::int64_t /*vocab*/) {
    refuse_vocab_parallel();
  }
  virtual double vocab_nll_loss_forward(const A* /*logp*/, const std::int32_t* /*targets*/,
                                        std::int64_t /*begin*/, std::int64_t /*n*/,
                                        std::int64_t /*vocab*/) {
    refuse_vocab_parallel();
    return 0;
  }
  virtual void vocab_cross_entropy_backward(S* /*dlogits*/, const A* /*logp*/,
                                            const std::int32_t* /*targets*/, std::int64_t /*begin*/,
                                            std::int64_t /*n*/, std::int64_t /*vocab*/,
                                            A /*scale*/) {
    refuse_vocab_parallel();
  }

  // ---- context parallelism: a rank's share of each sequence, its tokens at their places in it
  // (rotary at positions, kernels.hpp; ring attention's blocks, flash_attention_host.hpp's
  // forward_at and backward_at, same arguments). Context parallelism runs on the host backend
  // only; another backend refuses them.
  virtual void rope_at(S* /*x*/, const std::int32_t* /*positions*/, std::int64_t /*batch*/,
                       std::int64_t /*seq*/, std::int64_t /*heads*/, std::int64_t /*head_dim*/,
                       double /*theta*/, bool /*backward*/) {
    refuse_context_parallel();
  }
  virtual void flash_attention_forward_at(A* /*out_acc*/, A* /*lse*/, const S* /*q*/,
                                          const S* /*k*/, const S* /*v*/,
                                          flash_host::Positions /*at*/, bool /*first*/,
                                          std::int64_t /*batch*/, std::int64_t /*heads*/,
                                          std::int64_t /*kv_heads*/, std::int64_t /*head_dim*/) {
    refuse_context_parallel();
  }
  virtual void flash_attention_backward_at(S* /*dq*/, S* /*dk*/, S* /*dv*/, A* /*delta*/,
                                           const S* /*dout*/, const S* /*out*/, const A* /*lse*/,
                                           const S* /*q*/, const S* /*k*/, const S* /*v*/,
                                           flash_host::Positions /*at*/, std::int64_t /*batch*/,
                                           std::int64_t /*heads*/, std::int64_t /*kv_heads*/,
                                           std::int64_t /*head_dim*/) {
    refuse_context_parallel();
  }

  // ---- the engine's element-wise work
  virtual void copy(S* dst, const S* src, std::int64_t n) = 0;  // may not overlap
  virtual void add(S* dst, const S* src, std::int64_t n) = 0;   // dst += src
  // adamw.hpp's step on n elements of the master weights (A: fp32 for every compute type but the
  // gradient check's double).
  virtual void adamw_step(A* params, const A* grads, A* exp_avg, A* exp_avg_sq, std::int64_t n,
                          std::int64_t step, const AdamWOptions& options) = 0;
  // Mixed precision (scalar.hpp): the compute type's copies of the master weights and the master
  // type's copies of the computed gradients. With S = A these are a copy and an add.
  virtual void narrow(S* dst, const A* src, std::int64_t n) = 0;  // dst = S(src), may not overlap
  virtual void widen_add(A* dst, const S* src, std::int64_t n) = 0;  // dst += A(src)
  virtual void copy_wide(A* dst, const A* src, std::int64_t n) = 0;  // may not overlap
  virtual void scale(A* x, std::int64_t n, double factor) = 0;       // x *= factor
  // Whether every element is finite (fp16's loss scaling skips a step whose gradients overflowed).
  // Waits for the work queued on the compute stream.
  virtual bool all_finite(const A* x, std::int64_t n) = 0;

  // ---- order and time. A stream is a group's collective stream, or the compute stream (nullptr).
  // Nothing to do on the host: its collectives complete before they return.
  //
  // Work queued on `waiter` from now on starts after the work queued so far on `producer`. The
  // time the compute stream stalls in such a wait is counted in PartSeconds::comm_waits, by
  // producer.
  virtual void wait(comm::Communicator* waiter, comm::Communicator* producer) {
    (void)waiter;
    (void)producer;
  }
  // Memory at p is used by `user`'s work too: it is not handed out again before that work is done
  // (PyTorch's Tensor.record_stream).
  virtual void record_use(const void* p, comm::Communicator* user) {
    (void)p;
    (void)user;
  }
  // The stream of the allocations that follow (the one that first writes them: their zeroing,
  // and their wait for the previous users of reused memory).
  virtual void allocate_on(comm::Communicator* stream) { (void)stream; }
  // Waits until everything queued on the compute stream is done.
  virtual void synchronize() {}

  // Time of the parts of a step, bracketing work queued on the compute stream: wall time on the
  // host, CUDA events on a GPU (known after synchronize()).
  enum class Part { forward, backward, optimizer, copy };
  static constexpr std::size_t kParts = 4;
  struct PartSeconds {
    double forward = 0, backward = 0, optimizer = 0, copy = 0;
    // The compute stream stalled on each group's collective stream.
    std::map<const comm::Communicator*, double> comm_waits;
  };
  virtual void begin(Part part) = 0;
  virtual void end(Part part) = 0;
  // The seconds since the last call, and starts again. Call after synchronize().
  virtual PartSeconds take_seconds() = 0;

private:
  [[noreturn]] void refuse_vocab_parallel() const {
    throw std::logic_error(std::string("vocabulary-parallel kernels are not run on the ") + name() +
                           " backend (tensor parallelism runs on the cpu backend)");
  }
  [[noreturn]] void refuse_context_parallel() const {
    throw std::logic_error(std::string("ring attention's kernels are not run on the ") + name() +
                           " backend (context parallelism runs on the cpu backend)");
  }
};

class StreamOrderedHostMemory;  // kernels/host_stream_memory.hpp

// The CPU backend: kernels.hpp and adamw.hpp on the calling thread. Collectives either block that
// thread (a group without a host stream: nothing to order) or run on their group's own thread
// (comm/host_stream.hpp), ordered as a GPU orders streams: the computing thread blocks in
// wait(nullptr, group) until the group has done what it had queued (timed in comm_waits), a group
// waits for another on its own thread, and memory a group still uses is held back at its free
// when the allocator's memory is a StreamOrderedHostMemory (else record_use waits for the group).
template <class S> class HostBackend final : public Backend<S> {
public:
  using A = accum_t<S>;
  // memory: the memory the engine's allocator hands out (not owned), for record_use and
  // allocate_on; nullptr or any other source: record_use waits instead.
  explicit HostBackend(MemorySource* memory = nullptr);
  const char* name() const override { return "cpu"; }
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
  // Tiled FlashAttention-2 on the host (flash_attention_host.hpp), any head_dim.
  bool supports_flash_attention(std::int64_t) const override { return true; }
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
  void vocab_embedding_forward(S* out, const std::int32_t* tokens, const S* wte, const S* wpe,
                               std::int64_t begin, std::int64_t rows, std::int64_t batch,
                               std::int64_t seq, std::int64_t channels) override;
  void vocab_embedding_backward(S* dwte, S* dwpe, const S* dout, const std::int32_t* tokens,
                                std::int64_t begin, std::int64_t rows, std::int64_t batch,
                                std::int64_t seq, std::int64_t channels) override;
  void logits_row_max(A* max, const S* logits, std::int64_t n, std::int64_t vocab) override;
  void logits_row_sum_exp(A* sum, const S* logits, const A* max, std::int64_t n,
                          std::int64_t vocab) override;
  void log_softmax_from_stats(A* logp, const S* logits, const A* max, const A* sum, std::int64_t n,
                              std::int64_t vocab) override;
  double vocab_nll_loss_forward(const A* logp, const std::int32_t* targets, std::int64_t begin,
                                std::int64_t n, std::int64_t vocab) override;
  void vocab_cross_entropy_backward(S* dlogits, const A* logp, const std::int32_t* targets,
                                    std::int64_t begin, std::int64_t n, std::int64_t vocab,
                                    A scale) override;
  void rope_at(S* x, const std::int32_t* positions, std::int64_t batch, std::int64_t seq,
               std::int64_t heads, std::int64_t head_dim, double theta, bool backward) override;
  void flash_attention_forward_at(A* out_acc, A* lse, const S* q, const S* k, const S* v,
                                  flash_host::Positions at, bool first, std::int64_t batch,
                                  std::int64_t heads, std::int64_t kv_heads,
                                  std::int64_t head_dim) override;
  void flash_attention_backward_at(S* dq, S* dk, S* dv, A* delta, const S* dout, const S* out,
                                   const A* lse, const S* q, const S* k, const S* v,
                                   flash_host::Positions at, std::int64_t batch, std::int64_t heads,
                                   std::int64_t kv_heads, std::int64_t head_dim) override;
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
  void begin(typename Backend<S>::Part part) override;
  void end(typename Backend<S>::Part part) override;
  typename Backend<S>::PartSeconds take_seconds() override;

private:
  StreamOrderedHostMemory* memory_ = nullptr;
  std::chrono::steady_clock::time_point started_[Backend<S>::kParts];
  typename Backend<S>::PartSeconds seconds_;
};

extern template class HostBackend<float>;
extern template class HostBackend<double>;
extern template class HostBackend<bf16>;
extern template class HostBackend<f16>;

}  // namespace shardplan::kernels
