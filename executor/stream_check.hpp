// The engine under the stream-order checker (stream_order.hpp), on the CPU: three wrappers that
// tell the checker what the engine does, while the host backend and the communicators they wrap
// do the work.
//
//   CheckedBackend<S>     a Backend that forwards every call to another one (the host's) and
//                         tells the checker what each kernel reads and writes on the compute
//                         stream, and each wait, record_use, allocate_on and synchronize.
//   CheckedCommunicator   a Communicator whose collectives are one stream of their own (its
//                         stream_handle() is itself): each reads its send range and writes its
//                         receive range on that stream; synchronize() is a host wait.
//   CheckedMemory         a MemorySource that tells the checker of each allocation (for the stream
//                         the backend last named with allocate_on) and free, and keeps freed
//                         memory out of use until it is destroyed, so that a late access is
//                         recognized as one.
//
// The streams are CUDA's semantics, not threads: the work runs in program order on the calling
// thread, and the checker says whether it would be correct if each stream ran on its own. One
// StreamCheck holds the checker and the memory for one rank; tests make the engine's groups
// CheckedCommunicators (each a stream, as a GPU run's NCCL communicators are) and its backend a
// CheckedBackend.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/forwarding_communicator.hpp"
#include "executor/stream_order.hpp"
#include "kernels/adamw.hpp"
#include "kernels/backend.hpp"
#include "kernels/memory_source.hpp"
#include "kernels/scalar.hpp"

namespace shardplan::executor {

class CheckedMemory final : public kernels::MemorySource {
public:
  explicit CheckedMemory(StreamOrderChecker& checker) : checker_(checker) {}
  ~CheckedMemory() override;
  // The stream of the allocations that follow (Backend::allocate_on).
  void set_stream(StreamOrderChecker::Stream s) { stream_ = s; }
  StreamOrderChecker::Stream stream() const { return stream_; }

  void* allocate(std::int64_t bytes, bool zero) override;
  void free(void* data, std::int64_t bytes) noexcept override;
  bool host_accessible() const override { return true; }
  // Host copies: an operation on the memory's current stream that the host then waits for, as
  // a device's synchronous copies are.
  void write(void* dst, const void* host, std::int64_t bytes) override;
  void read(void* host, const void* src, std::int64_t bytes) override;
  void copy(void* dst, const void* src, std::int64_t bytes) override;

private:
  StreamOrderChecker& checker_;
  StreamOrderChecker::Stream stream_ = nullptr;
  kernels::HostMemory heap_;
  std::vector<std::pair<void*, std::int64_t>> quarantine_;  // freed, given back at destruction
  std::int64_t count_ = 0;
};

class CheckedCommunicator final : public comm::ForwardingCommunicator {
public:
  // Neither is owned. name: the stream's name in findings ("shard", "reduce", "replica").
  CheckedCommunicator(comm::Communicator& inner, StreamOrderChecker& checker, std::string name);

  void* stream_handle() const override { return const_cast<CheckedCommunicator*>(this); }
  void do_all_reduce(const void* send, void* recv, std::size_t count, comm::DataType type,
                     comm::ReduceOp op) override;
  void do_reduce(const void* send, void* recv, std::size_t count, comm::DataType type, int root,
                 comm::ReduceOp op) override;
  void all_gather(const void* send, void* recv, std::size_t count, comm::DataType type) override;
  void do_reduce_scatter(const void* send, void* recv, std::size_t count, comm::DataType type,
                         comm::ReduceOp op) override;
  void broadcast(void* buffer, std::size_t count, comm::DataType type, int root) override;
  void all_to_all(const void* send, void* recv, std::size_t count, comm::DataType type) override;
  void synchronize() override;

private:
  void access(const void* send, std::int64_t send_bytes, const void* recv, std::int64_t recv_bytes,
              const char* what);

  StreamOrderChecker& checker_;
};

template <class S> class CheckedBackend final : public kernels::Backend<S> {
public:
  using A = kernels::accum_t<S>;
  using Part = typename kernels::Backend<S>::Part;
  // None is owned.
  CheckedBackend(kernels::Backend<S>& inner, StreamOrderChecker& checker, CheckedMemory& memory);

  const char* name() const override { return inner_.name(); }
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
                                          std::int64_t heads) const override {
    return inner_.attention_scratch_elements(batch, seq, heads);
  }
  void attention_backward(S* dq, S* dk, S* dv, S* scratch, const S* dout, const S* probs,
                          const S* q, const S* k, const S* v, std::int64_t batch, std::int64_t seq,
                          std::int64_t heads, std::int64_t kv_heads,
                          std::int64_t head_dim) override;
  bool supports_flash_attention(std::int64_t head_dim) const override {
    return inner_.supports_flash_attention(head_dim);
  }
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
                  std::int64_t step, const kernels::AdamWOptions& options) override;
  void narrow(S* dst, const A* src, std::int64_t n) override;
  void widen_add(A* dst, const S* src, std::int64_t n) override;
  void copy_wide(A* dst, const A* src, std::int64_t n) override;
  void scale(A* x, std::int64_t n, double factor) override;
  bool all_finite(const A* x, std::int64_t n) override;

  void wait(comm::Communicator* waiter, comm::Communicator* producer) override;
  void record_use(const void* p, comm::Communicator* user) override;
  void allocate_on(comm::Communicator* stream) override;
  void synchronize() override;
  void begin(Part part) override { inner_.begin(part); }
  void end(Part part) override { inner_.end(part); }
  typename kernels::Backend<S>::PartSeconds take_seconds() override {
    return inner_.take_seconds();
  }

private:
  // The checker's stream of a group: its own under CheckedCommunicator; the compute stream for a
  // group without one (as CudaBackend::stream_of).
  StreamOrderChecker::Stream stream_of(const comm::Communicator* c) const;
  template <class T> void r(const T* p, std::int64_t n, const char* what) {
    if (p != nullptr)
      checker_.read(compute(), p, n < 0 ? -1 : n * static_cast<std::int64_t>(sizeof(T)), what);
  }
  template <class T> void w(const T* p, std::int64_t n, const char* what) {
    if (p != nullptr)
      checker_.write(compute(), p, n < 0 ? -1 : n * static_cast<std::int64_t>(sizeof(T)), what);
  }
  StreamOrderChecker::Stream compute() const { return this; }

  kernels::Backend<S>& inner_;
  StreamOrderChecker& checker_;
  CheckedMemory& memory_;
};

extern template class CheckedBackend<float>;
extern template class CheckedBackend<kernels::bf16>;
extern template class CheckedBackend<kernels::f16>;

}  // namespace shardplan::executor
